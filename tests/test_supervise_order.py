"""The order supervision promises: when a call on a mesh fails because an actor of it
died, the mesh's owner has been told first. Its ``__supervise__`` for that failure is in
its inbox before the caller's error is raised, so the owner handles it before any call
sent to it after the error (Monarch's tests ask the owner what it saw right after the
failing call, with nothing in between)."""

from __future__ import annotations

import asyncio
import os

import pytest

from monarch_nb.actor import Actor, Channel, MeshFailure, Port, SupervisionError, context, endpoint, this_host

ROUNDS = 3  # children killed per test: the order must hold every time, not by luck


class Child(Actor):
    @endpoint
    async def die(self, rank: int) -> None:
        """Rank ``rank`` dies, the others answer."""
        if context().actor_instance.rank.rank == rank:
            raise SystemExit(3)  # a BaseException: the actor dies, its proc lives on

    @endpoint
    async def die_all(self) -> None:
        """Every rank dies (Monarch's test_supervise_callback_with_mesh_ref)."""
        raise SystemExit(3)

    @endpoint
    async def die_or_hold(self, rank: int, gate: str) -> int:
        """Rank ``rank`` dies; the others run on until the file ``gate`` exists."""
        me = context().actor_instance.rank.rank
        if me == rank:
            raise SystemExit(3)
        while not os.path.exists(gate):
            await asyncio.sleep(0.05)
        return me

    @endpoint
    async def alive(self) -> int:
        return context().actor_instance.rank.rank

    @endpoint
    async def exit_proc(self) -> None:
        os._exit(1)  # the proc dies: the call fails through the hub's news of it


class _ChildOwner:
    """What the owners share: a child mesh on ``child_procs``, spawned anew each round,
    and the failures their ``__supervise__`` took, in order."""

    def __init__(self, child_procs):
        self.child_procs = child_procs
        self.round = 0
        self.children = self._spawn()
        self.failures: list[tuple[str, list[int]]] = []

    def _spawn(self):
        self.round += 1
        return self.child_procs.spawn(f"child{self.round}", Child)

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append((failure.meshes[0], list(failure.ranks)))
        return True


class AsyncOwner(_ChildOwner, Actor):
    """Monarch's shape: ``async`` endpoints, a child mesh spawned in ``__init__``."""

    @endpoint
    async def kill_children(self, how: str, *args) -> None:
        """Call ``how`` (``die`` or ``exit_proc``) on every child and expect the failure;
        after ``die`` (the procs live on), spawn the next children."""
        with pytest.raises(SupervisionError):
            await getattr(self.children, how).call(*args)
        if how == "die":
            self.children = self._spawn()

    @endpoint
    async def children_mesh(self):
        return self.children

    @endpoint
    async def seen(self) -> list[tuple[str, list[int]]]:
        return self.failures


class AsyncSuperviseOwner(AsyncOwner):
    async def __supervise__(self, failure: MeshFailure) -> bool:
        await asyncio.sleep(0)  # it runs on the actor's loop, between the endpoint's awaits
        self.failures.append((failure.meshes[0], list(failure.ranks)))
        return True


class ProcOwner(AsyncOwner):
    """Owns its child procs too (spawned with ``this_host()``): a proc's death is a
    failure of the proc mesh, which goes to the proc mesh's owner."""

    def __init__(self):
        super().__init__(this_host().spawn_procs(per_host={"gpus": 1}, name="owned-procs"))


class ThreadOwner(_ChildOwner, Actor):
    """A thread actor (plain ``def`` endpoints): busy in the failing call, it handles the
    failure as soon as that call returns."""

    @endpoint
    def kill_children(self, how: str, *args) -> None:
        with pytest.raises(SupervisionError):
            getattr(self.children, how).call(*args).get(timeout=60)
        if how == "die":
            self.children = self._spawn()

    @endpoint
    def seen(self) -> list[tuple[str, list[int]]]:
        return self.failures

    @endpoint
    def renew(self):
        """New children: returns their mesh."""
        self.children = self._spawn()
        return self.children

    @endpoint
    def gate(self) -> Port:
        """The port that ends :meth:`hold`."""
        self.opens, self.opened = Channel.open()
        return self.opens

    @endpoint
    def hold(self) -> None:
        """Busy until the gate's port is sent something (it comes by the proc's mailbox,
        not this actor's inbox)."""
        self.opened.recv().get(timeout=60)


class CallingAsyncOwner(AsyncOwner):
    """Its ``__supervise__`` calls the survivor of the failed mesh (while the endpoint
    that made it fail still awaits)."""

    def _spawn(self):
        mesh = super()._spawn()
        self.by_name = {**getattr(self, "by_name", {}), mesh.name: mesh}
        return mesh

    async def __supervise__(self, failure: MeshFailure) -> bool:
        survivor = self.by_name[failure.meshes[0]].slice(gpus=1 - failure.ranks[0])
        self.failures.append((failure.meshes[0], list(failure.ranks), await survivor.alive.call_one()))
        return True


class CallingThreadOwner(ThreadOwner):
    def _spawn(self):
        mesh = super()._spawn()
        self.by_name = {**getattr(self, "by_name", {}), mesh.name: mesh}
        return mesh

    def __supervise__(self, failure: MeshFailure) -> bool:
        survivor = self.by_name[failure.meshes[0]].slice(gpus=1 - failure.ranks[0])
        self.failures.append((failure.meshes[0], list(failure.ranks), survivor.alive.call_one().get(timeout=30)))
        return True


class Caller(Actor):
    """Calls a mesh someone else owns."""

    @endpoint
    async def kill(self, mesh, rank: int) -> None:
        with pytest.raises(SupervisionError):
            await mesh.die.call(rank)

    @endpoint
    async def kill_all(self, mesh) -> str:
        with pytest.raises(SupervisionError) as info:
            await mesh.die_all.call()
        return str(info.value)


@pytest.fixture
def meshes(host):
    made = []

    def spawn(name: str, gpus: int):
        procs = host.spawn_procs(per_host={"gpus": gpus}, name=name)
        made.append(procs)
        return procs

    yield spawn
    for procs in made:
        procs.stop()


@pytest.mark.parametrize("owner_class", [AsyncOwner, AsyncSuperviseOwner, ThreadOwner])
def test_owner_has_supervised_a_dead_child_before_its_own_call_fails(meshes, faults, owner_class):
    owner = meshes("owner", 1).spawn("owner", owner_class, meshes("children", 2))
    for i in range(1, ROUNDS + 1):
        owner.kill_children.call_one("die", i % 2).get(timeout=60)
        seen = owner.seen.call_one().get(timeout=30)  # asked at once: no wait, no retry
        assert seen[i - 1:] == [(f"child{i}", [i % 2])], seen
    assert not faults  # handled by the owner


def test_owner_has_supervised_a_dead_proc_before_its_own_call_fails(meshes, faults):
    owner = meshes("owner", 1).spawn("owner", ProcOwner)
    owner.kill_children.call_one("exit_proc").get(timeout=60)
    assert owner.seen.call_one().get(timeout=30) == [("child1", [0])]
    assert not faults


def test_owner_has_supervised_a_failure_before_another_actor_s_call_fails(meshes, faults):
    """A mesh passed to another actor: its failures go to its owner, and the owner has
    them before the caller's error (Monarch's test_supervise_callback_with_mesh_ref)."""
    procs = meshes("actors", 1)
    owner = procs.spawn("owner", AsyncOwner, meshes("children", 4))
    caller = procs.spawn("caller", AsyncOwner, meshes("other-children", 1))
    children = owner.children_mesh.call_one().get(timeout=30)
    caller_actor = procs.spawn("plain-caller", Caller)
    caller_actor.kill.call_one(children, 2).get(timeout=60)
    assert owner.seen.call_one().get(timeout=30) == [("child1", [2])]
    assert caller.seen.call_one().get(timeout=30) == []  # not the owner: told nothing
    assert not faults


def test_a_busy_owner_takes_the_failure_before_calls_that_came_after_it(meshes, faults):
    """The owner is busy while another actor's call on its mesh fails, and a call to the
    owner is sent after that error: the owner runs ``__supervise__`` first, as soon as
    its busy call returns, whichever of the two its inbox would have given it first."""
    owner = meshes("owner", 1).spawn("owner", ThreadOwner, meshes("children", 2))
    caller = meshes("caller", 1).spawn("caller", Caller)
    gate = owner.gate.call_one().get(timeout=30)
    for i in range(1, ROUNDS + 1):
        children = owner.renew.call_one().get(timeout=30)
        held = owner.hold.call_one()
        caller.kill.call_one(children, i % 2).get(timeout=60)
        seen = owner.seen.call_one()  # queued behind hold(): sent after the caller's error
        gate.send(None)
        held.get(timeout=30)
        assert seen.get(timeout=30)[i - 1:] == [(f"child{i + 1}", [i % 2])]
    assert not faults


@pytest.mark.parametrize("owner_class", [CallingAsyncOwner, CallingThreadOwner])
def test_a_supervise_that_calls_the_failed_mesh_runs_in_order_without_deadlock(meshes, faults, owner_class):
    owner = meshes("owner", 1).spawn("owner", owner_class, meshes("children", 2))
    owner.kill_children.call_one("die", 0).get(timeout=60)
    assert owner.seen.call_one().get(timeout=30) == [("child1", [0], 1)]
    assert not faults


def test_a_call_whose_ranks_all_die_names_them_all_and_the_owner_has_every_failure(meshes, faults):
    """Every rank of a mesh dies in one call made by another actor: the call's error
    comes once each rank has answered or died, so it names all four, and the owner, asked
    right after, has taken all four failures (Monarch's
    test_supervise_callback_with_mesh_ref; before, the call failed at the first death and
    the owner could be asked before a later rank's failure reached it)."""
    owner = meshes("owner", 1).spawn("owner", ThreadOwner, meshes("children", 4))
    caller = meshes("caller", 1).spawn("caller", Caller)
    for i in range(1, ROUNDS + 1):
        children = owner.renew.call_one().get(timeout=30)
        message = caller.kill_all.call_one(children).get(timeout=60)
        assert "(4 of 4 ranks)" in message and all(f"child{i + 1} rank {r}:" in message for r in range(4)), message
        seen = owner.seen.call_one().get(timeout=30)  # asked at once: no wait, no retry
        assert sorted(seen[4 * (i - 1):]) == [(f"child{i + 1}", [r]) for r in range(4)], seen
    assert not faults


def test_a_call_with_a_dead_rank_does_not_wait_for_ranks_that_run_on(meshes, faults, tmp_path):
    """The wait for the other ranks after a death is bounded: ranks still running
    (here until a file exists, which only this test makes, after the call failed) do not
    hold the caller's error, which names the dead rank alone; they finish their call."""
    owner = meshes("owner", 1).spawn("owner", ThreadOwner, meshes("children", 2))
    children = owner.renew.call_one().get(timeout=30)
    gate = str(tmp_path / "gate")
    with pytest.raises(SupervisionError) as info:
        children.die_or_hold.call(0, gate).get(timeout=60)
    assert "child2 rank 0:" in str(info.value) and "(1 of 2 ranks)" in str(info.value), str(info.value)
    assert not os.path.exists(gate)  # the error came while rank 1 still ran
    open(gate, "w").close()
    assert children.slice(gpus=1).alive.call_one().get(timeout=30) == 1  # rank 1 finished and serves on
    assert owner.seen.call_one().get(timeout=30) == [("child2", [0])]
    assert not faults
