"""Monarch's mesh lifecycle and names on real procs: stop() returns a Future, actor mesh
names are scoped to their proc mesh, clusters find meshes by bare or qualified name, and
Monarch's smaller API names (Accumulator, current_actor_name, size, flatten,
logging_option)."""

from __future__ import annotations

import asyncio

import pytest

from conftest import pids_alive, wait_until
from monarch_nb.actor import Accumulator, Future, InvalidRequest, current_actor_name, endpoint
from sample_actors import Counter


def test_proc_mesh_stop_runs_at_once_and_returns_a_finished_future(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="stopfuture")
    pids = procs.pids
    result = procs.stop()
    assert isinstance(result, Future) and result.done() and result.get() is None
    assert wait_until(lambda: not pids_alive(pids), 10)


def test_stop_futures_can_be_awaited(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="awaitstop")
    actors = procs.spawn("awaited", Counter)

    async def stop_both():
        return await actors.stop(), await procs.stop()

    assert asyncio.run(stop_both()) == (None, None)


def test_host_mesh_stop_ends_only_the_proc_meshes_it_spawned(cluster):
    mine, other = cluster.host_mesh(), cluster.host_mesh()
    procs = mine.spawn_procs(per_host={"gpus": 1}, name="hoststop")
    kept = other.spawn_procs(per_host={"gpus": 1}, name="hostkept")
    try:
        assert mine.stop().get() is None
        assert wait_until(lambda: not pids_alive(procs.pids), 10)
        assert "hoststop" not in cluster.proc_meshes and pids_alive(kept.pids) == kept.pids
    finally:
        kept.stop()


def test_host_mesh_refuses_spawns_after_shutdown(cluster):
    hosts = cluster.host_mesh()
    hosts.spawn_procs(per_host={"gpus": 1}, name="shutdownprocs")
    assert hosts.shutdown().get() is None
    assert "shutdownprocs" not in cluster.proc_meshes
    with pytest.raises(RuntimeError, match="already been shut down"):
        hosts.spawn_procs(per_host={"gpus": 1})


def test_same_actor_mesh_name_on_two_proc_meshes_gives_two_meshes(host):
    first = host.spawn_procs(per_host={"gpus": 2}, name="scope1")
    second = host.spawn_procs(per_host={"gpus": 1}, name="scope2")
    try:
        a = first.spawn("counter", Counter, 1)
        b = second.spawn("counter", Counter, 2)
        assert a.get.call().get().values() == [1, 1] and b.get.call().get().values() == [2]
        b.stop()
        assert a.get.call().get().values() == [1, 1]
    finally:
        first.stop()
        second.stop()


def test_respawning_a_name_on_its_proc_mesh_returns_the_live_mesh(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="rerun")
    try:
        procs.spawn("kept", Counter, 0).incr.call(5).get()
        assert procs.spawn("kept", Counter, 0).get.call().get().values() == [5]
        with pytest.raises(InvalidRequest, match="actor mesh named 'kept' exists on proc mesh 'rerun'"):
            procs.spawn("kept", _Other)
    finally:
        procs.stop()


def test_cluster_finds_actor_meshes_by_bare_name_when_unambiguous_else_by_key(cluster, host):
    first = host.spawn_procs(per_host={"gpus": 1}, name="find1")
    second = host.spawn_procs(per_host={"gpus": 1}, name="find2")
    try:
        first.spawn("only", Counter, 7)
        first.spawn("twice", Counter, 1)
        second.spawn("twice", Counter, 2)
        meshes = cluster.actor_meshes
        assert {"find1/only", "find1/twice", "find2/twice"} <= set(meshes)
        assert meshes["only"].get.call_one().get() == 7 and "only" in meshes
        assert meshes["find2/twice"].get.call_one().get() == 2
        with pytest.raises(KeyError, match="'find1/twice', 'find2/twice'"):
            meshes["twice"]
    finally:
        first.stop()
        second.stop()


class _Other(Counter):
    pass


class Named(Counter):
    @endpoint
    def actor_name(self) -> str:
        return current_actor_name()


def test_accumulator_folds_every_actors_reply(procs4):
    counters = procs4.spawn("accumulated", Counter, 3)
    assert Accumulator(counters.get, 1, lambda acc, v: acc + v).accumulate().get() == 13


def test_current_actor_name_is_unique_per_actor(procs4):
    names = procs4.spawn("named", Named).actor_name.call().get().values()
    assert len(set(names)) == 4 and all(".named[" in n for n in names)


def test_size_and_flatten_follow_the_extent(procs4):
    counters = procs4.spawn("sized", Counter, 0)
    assert counters.size() == 4 and counters.size("gpus") == 4 and counters.size(("gpus",)) == 4
    with pytest.raises(KeyError):
        counters.size("hosts")  # this_host()'s procs have no hosts dimension
    flat = counters.flatten("r")
    assert dict(flat.extent) == {"r": 4}
    assert flat.slice(r=2).incr.call_one(1).get() == 1
    assert counters.get.call().get().values() == [0, 0, 1, 0]


def test_logging_option_is_accepted_and_checked(procs4):
    assert procs4.logging_option(stream_to_client=True, aggregate_window_sec=None).get() is None
    with pytest.raises(ValueError, match="stream_to_client"):
        procs4.logging_option(stream_to_client=False, aggregate_window_sec=5)
    # Monarch's is async def; its getting-started example runs it with asyncio.run
    # ("a coroutine was expected, got <Future ...>"), others await it.
    assert asyncio.run(procs4.logging_option(stream_to_client=True, aggregate_window_sec=3)) is None

    async def awaited():
        return await procs4.logging_option()

    assert asyncio.run(awaited()) is None
