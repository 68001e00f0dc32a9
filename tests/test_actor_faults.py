"""Monarch's supervision faults: an ``__init__`` that raises, and a ``BaseException``
that is not an ``Exception``, kill the actor; ``unhandled_fault_hook`` hears of it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest

import monarch_nb.actor
from monarch_nb.actor import Actor, ActorError, MeshFailure, SupervisionError, endpoint, this_proc

from conftest import wait_until
from kernels import TESTS

BOUND_S = 10.0


class InitRaisesOn(Actor):
    def __init__(self, bad_rank: int):
        if monarch_nb.actor.current_rank().rank == bad_rank:
            raise ValueError("no GPU here")

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Exits(Actor):
    @endpoint
    def leave(self) -> None:
        raise SystemExit(3)

    @endpoint
    def interrupted(self) -> None:
        raise KeyboardInterrupt

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Mixed(Actor):
    @endpoint
    def now(self) -> int:
        return 1

    @endpoint
    async def later(self) -> int:
        return 2


class Owner(Actor):
    def __init__(self):
        self.failures: list[str] = []

    @endpoint
    def kill_child(self) -> None:
        self.child = monarch_nb.actor.this_host().spawn_procs(per_host={"gpus": 1}, name="owned").spawn(
            "owned", Exits)
        with pytest.raises(SupervisionError):
            self.child.leave.call_one().get(timeout=30)

    @endpoint
    def seen(self) -> list[str]:
        return self.failures

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(f"{failure.kind} {failure.meshes} {failure.ranks}")
        return True


def test_an_init_that_raises_is_a_fault_the_spawn_returns_and_calls_to_it_raise(host, faults):
    procs = host.spawn_procs(per_host={"gpus": 2}, name="initfault")
    try:
        mesh = procs.spawn("initfault", InitRaisesOn, 1)
        assert wait_until(lambda: faults, BOUND_S)
        assert faults[0].kind == "actor_failed" and faults[0].ranks == (1,)
        assert "initfault" in str(faults[0]) and "no GPU here" in str(faults[0])
        with pytest.raises(SupervisionError, match="__init__ raised ValueError: no GPU here"):
            mesh.pid.call().get(timeout=30)
        assert mesh.slice(gpus=0).pid.call_one().get(timeout=30) in procs.pids
    finally:
        procs.stop()


def test_a_script_hears_of_an_init_failure_at_once_and_initialized_raises_it(cluster):
    # Monarch users asked for this (meta-pytorch/monarch#2049): the spawn returns (a
    # fault, as in Monarch), but a script says so on stderr before its next line runs,
    # and ActorMesh.initialized raises the __init__ failure.
    script = textwrap.dedent(f"""
        import sys
        from monarch_nb.client.cluster import Cluster, cluster_dir
        from monarch_nb.actor import this_host, SupervisionError
        from test_actor_faults import InitRaisesOn
        path = cluster_dir.cluster_path({cluster.name!r})
        Cluster({cluster.name!r}, path, cluster_dir.read_info(path))._attach()
        procs = this_host().spawn_procs(per_host={{"gpus": 2}}, name="script_initfault")
        mesh = procs.spawn("initfault", InitRaisesOn, 1)
        print("spawn returned", file=sys.stderr, flush=True)
        assert mesh.slice(gpus=0).initialized.get() is True
        try:
            mesh.initialized.get()
        except SupervisionError as e:
            print("initialized raised:", str(e).replace(chr(10), " "), flush=True)
        procs.stop()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=TESTS)
    assert out.returncode == 0, out.stderr
    said = out.stderr.split("spawn returned")[0]
    assert "unhandled failure" in said and "no GPU here" in said, out.stderr
    assert "initialized raised:" in out.stdout and "1 of 2 actors are gone" in out.stdout \
        and "__init__ raised ValueError: no GPU here" in out.stdout, out.stdout


def test_an_init_that_raises_in_this_proc_is_a_fault_too(faults):
    mesh = this_proc().spawn("local_initfault", InitRaisesOn, 0)
    try:
        assert [f.meshes for f in faults] == [("local_initfault",)]
        with pytest.raises(SupervisionError, match="no GPU here"):
            mesh.pid.call_one().get(timeout=30)
    finally:
        mesh.stop()


def test_a_base_exception_that_is_not_an_exception_kills_the_actor(host, faults):
    procs = host.spawn_procs(per_host={"gpus": 2}, name="exits")
    try:
        mesh = procs.spawn("exits", Exits)
        with pytest.raises(SupervisionError, match="leave raised SystemExit: 3"):
            mesh.slice(gpus=1).leave.call_one().get(timeout=30)
        with pytest.raises(SupervisionError, match="exits rank 1"):
            mesh.slice(gpus=1).pid.call_one().get(timeout=30)
        assert wait_until(lambda: faults, BOUND_S)
        assert (faults[0].kind, faults[0].meshes, faults[0].ranks, faults[0].endpoint) == (
            "actor_failed", ("exits",), (1,), "leave")
        # Only the actor died: its proc and the other rank serve on.
        assert mesh.slice(gpus=0).pid.call_one().get(timeout=30) == procs.pids[0]
        assert procs.spawn("after", Exits).slice(gpus=1).pid.call_one().get(timeout=30) == procs.pids[1]
    finally:
        procs.stop()


def test_a_keyboard_interrupt_fails_only_its_call(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="kbd")
    try:
        mesh = procs.spawn("kbd", Exits)
        with pytest.raises(ActorError):
            mesh.interrupted.call_one().get(timeout=30)
        assert mesh.pid.call_one().get(timeout=30) == procs.pids[0]
    finally:
        procs.stop()


def test_a_child_killed_by_a_base_exception_reaches_its_owners_supervise(host, faults):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="owner")
    try:
        owner = procs.spawn("owner", Owner)
        owner.kill_child.call_one().get(timeout=60)
        assert wait_until(lambda: owner.seen.call_one().get(timeout=30), BOUND_S) == [
            "actor_failed ('owned',) (0,)"]
        assert not faults  # handled by the owner
    finally:
        procs.stop()


def test_an_actor_mixing_sync_and_async_endpoints_is_refused_at_spawn(procs4):
    with pytest.raises(ValueError, match=r"Mixed mixes both async and sync endpoints: sync now; async later"):
        procs4.spawn("mixed", Mixed)


class Parent(Actor):
    """Spawns a child mesh named "kids" on ``procs`` (the same name in every parent)."""

    def __init__(self, procs):
        self.kids = procs.spawn("kids", Exits)
        self.failures: list[str] = []

    @endpoint
    def kids_name(self) -> str:
        return self.kids.name

    @endpoint
    def kill_kids(self) -> None:
        with pytest.raises(SupervisionError):
            self.kids.leave.call_one().get(timeout=30)

    @endpoint
    def seen(self) -> list[str]:
        return self.failures

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(failure.meshes[0])
        return True


def test_actors_spawning_one_name_each_get_and_supervise_their_own_mesh(host, faults):
    kid_procs = host.spawn_procs(per_host={"gpus": 1}, name="kidprocs")
    procs = host.spawn_procs(per_host={"gpus": 2}, name="parents")
    try:
        parents = procs.spawn("parents", Parent, kid_procs)
        names = parents.kids_name.call().get(timeout=30).values()
        assert sorted(names) in (["kids", "kids.parents-1"], ["kids", "kids.parents-0"])
        parents.slice(gpus=1).kill_kids.call_one().get(timeout=30)
        assert wait_until(lambda: parents.slice(gpus=1).seen.call_one().get(timeout=30), BOUND_S) == [names[1]]
        assert parents.slice(gpus=0).seen.call_one().get(timeout=30) == []
        assert parents.slice(gpus=0).kids_name.call_one().get(timeout=30) == names[0]  # its own, still alive
        assert not faults  # handled by the owner
    finally:
        procs.stop()
        kid_procs.stop()


class AsyncOwner(Actor):
    """Its ``async def __supervise__`` is still recording when the next call arrives."""

    def __init__(self):
        self.failures: list[str] = []
        self.supervising = asyncio.Event()

    @endpoint
    async def kill_child(self) -> None:
        self.child = monarch_nb.actor.this_host().spawn_procs(per_host={"gpus": 1}, name="async-owned").spawn(
            "async-owned", Exits)
        with pytest.raises(SupervisionError):
            await self.child.leave.call_one()
        await asyncio.wait_for(self.supervising.wait(), 30)

    @endpoint
    async def seen(self) -> list[str]:
        return self.failures

    async def __supervise__(self, failure: MeshFailure) -> bool:
        self.supervising.set()
        await asyncio.sleep(0.5)  # a window for the next call to run too early: it must not
        self.failures.append(failure.meshes[0])
        return True


def test_a_call_taken_after_an_async_supervise_began_sees_what_it_recorded(host, faults):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="async-owner")
    try:
        owner = procs.spawn("async-owner", AsyncOwner)
        owner.kill_child.call_one().get(timeout=60)
        assert owner.seen.call_one().get(timeout=30) == ["async-owned"]
        assert not faults  # handled by the owner
    finally:
        procs.stop()
