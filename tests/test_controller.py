"""Controllers (``get_or_spawn_controller``): one actor per name per cluster, the same
from every client and endpoint; and ``context().actor_instance``, whose ``abort()``
kills its actor as a supervision fault."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

import monarch_nb.actor
from monarch_nb.actor import Actor, MeshFailure, SupervisionError, context, endpoint, get_or_spawn_controller
from monarch_nb.client.cluster import Cluster
from monarch_nb.client.runtime import runtime

from conftest import cluster_processes, wait_until


class Store(Actor):
    def __init__(self, label: str = "store"):
        self.label = label
        self.items: dict = {}

    @endpoint
    def put(self, key, value) -> None:
        self.items[key] = value

    @endpoint
    def get(self, key):
        return self.items[key]

    @endpoint
    def where(self) -> tuple[int, str]:
        return os.getpid(), self.label


class Counted(Actor):
    made = 0  # per proc: how many were constructed there

    def __init__(self):
        type(self).made += 1

    @endpoint
    def made_here(self) -> tuple[int, int]:
        return os.getpid(), type(self).made


class Asker(Actor):
    """Asks for controllers from inside its endpoints."""

    @endpoint
    def read_store(self, key):
        return get_or_spawn_controller("store", Store).get().get.call_one(key).get()

    @endpoint
    def make_store(self, name: str, label: str) -> None:
        get_or_spawn_controller(name, Store, label=label).get()


class Aborts(Actor):
    @endpoint
    def abort(self, reason: str | None = None) -> None:
        context().actor_instance.abort(reason)

    @endpoint
    def me(self) -> dict:
        actor = context().actor_instance
        return {"rank": actor.rank.rank, "name": actor.name, "class_name": actor.class_name,
                "proc_id": actor.proc_id, "actor_id": actor.actor_id}


@pytest.fixture(scope="module")
def connected():
    """An ephemeral cluster that ``this_host()`` and controllers refer to."""
    previous = runtime().cluster
    cluster = Cluster.start_ephemeral()
    runtime().cluster = cluster
    yield cluster
    runtime().cluster = previous
    cluster.stop()
    assert wait_until(lambda: not cluster_processes(cluster.path), 10), cluster_processes(cluster.path)


@pytest.fixture(scope="module")
def askers(connected):
    procs = connected.host_mesh().spawn_procs(per_host={"gpus": 2}, name="askers")
    yield procs.spawn("askers", Asker)
    procs.stop()


@pytest.fixture
def faults():
    """Failures that reached ``monarch_nb.actor.unhandled_fault_hook``."""
    seen: list[MeshFailure] = []
    default = monarch_nb.actor.unhandled_fault_hook
    monarch_nb.actor.unhandled_fault_hook = seen.append
    yield seen
    monarch_nb.actor.unhandled_fault_hook = default


def test_two_calls_give_the_same_controller_and_it_keeps_its_state(connected):
    first = get_or_spawn_controller("store", Store).get()
    first.put.call_one("a", 1).get()
    second = get_or_spawn_controller("store", Store, label="unused").get()
    assert second.get.call_one("a").get() == 1
    assert second.where.call_one().get() == first.where.call_one().get()
    assert dict(second.extent) == {}


def test_a_controller_lives_in_the_clusters_controllers_proc_not_in_the_client(connected):
    pid, _ = get_or_spawn_controller("store", Store).get().where.call_one().get()
    assert pid != os.getpid()
    assert connected.proc_meshes["controllers"].pids == [pid]
    assert "controllers/store" in connected.actor_meshes


def test_the_future_can_be_awaited(connected):
    async def ask():
        return await get_or_spawn_controller("store", Store)

    assert asyncio.run(ask()).get.call_one("a").get() == 1


def test_an_endpoint_gets_the_same_controller_as_the_client(connected, askers):
    get_or_spawn_controller("store", Store).get().put.call_one("b", 2).get()
    assert askers.read_store.call("b").get().values() == [2, 2]


def test_a_controller_spawned_from_an_endpoint_belongs_to_the_cluster(connected):
    procs = connected.host_mesh().spawn_procs(per_host={"gpus": 1}, name="short_lived")
    procs.spawn("asker", Asker).make_store.call_one("made_inside", "from an endpoint").get()
    procs.stop()  # the asker is gone; the controller it made is not
    made = get_or_spawn_controller("made_inside", Store).get()
    assert made.where.call_one().get()[1] == "from an endpoint"


def test_concurrent_first_calls_make_one_controller(connected):
    handles = []
    threads = [threading.Thread(target=lambda: handles.append(get_or_spawn_controller("counted", Counted).get()))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(handles) == 4
    assert {h.made_here.call_one().get() for h in handles} == {handles[0].made_here.call_one().get()}
    assert handles[0].made_here.call_one().get()[1] == 1


def test_a_name_taken_by_another_class_is_refused(connected):
    get_or_spawn_controller("store", Store).get()
    with pytest.raises(ValueError, match="store"):
        get_or_spawn_controller("store", Counted)


def test_actor_instance_names_the_actor(connected):
    procs = connected.host_mesh().spawn_procs(per_host={"gpus": 2}, name="named")
    try:
        me = procs.spawn("aborters", Aborts).slice(gpus=1).me.call_one().get()
        assert me == {"rank": 1, "name": "aborters", "class_name": f"{__name__}.Aborts", "proc_id": "named/1",
                      "actor_id": "named/1.aborters[1]"}
    finally:
        procs.stop()


def test_abort_kills_the_actor_and_its_calls_raise_supervision_error(connected, faults):
    procs = connected.host_mesh().spawn_procs(per_host={"gpus": 1}, name="aborting")
    try:
        actor = procs.spawn("aborter", Aborts)
        with pytest.raises(SupervisionError):
            actor.abort.call_one("lost my GPU").get(timeout=30)
        with pytest.raises(SupervisionError, match="lost my GPU"):
            actor.me.call_one().get(timeout=30)
        assert wait_until(lambda: faults, 10)
        assert "lost my GPU" in faults[0].report() and "Aborts" in faults[0].report()
    finally:
        procs.stop()


def test_abort_without_a_reason_says_so(connected):
    procs = connected.host_mesh().spawn_procs(per_host={"gpus": 1}, name="aborting2")
    try:
        actor = procs.spawn("aborter", Aborts)
        with pytest.raises(SupervisionError, match="no reason provided"):
            actor.abort.call_one().get(timeout=30)
    finally:
        procs.stop()
