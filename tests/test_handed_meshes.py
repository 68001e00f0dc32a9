"""An actor that calls a mesh it was handed (an argument), without ever calling
``this_host()``, hears of its actors' deaths as the client does: its call fails with
``SupervisionError`` at once instead of waiting out its timeout (or for good)."""

from __future__ import annotations

import pytest

from handed_actors import AsyncCaller, Caller, Child

BOUND_S = 120


@pytest.fixture
def meshes(host):
    child_procs = host.spawn_procs(per_host={"gpus": 2}, name="handed_children")
    caller_procs = host.spawn_procs(per_host={"gpus": 1}, name="handed_callers")
    try:
        yield child_procs.spawn("children", Child), caller_procs
    finally:
        child_procs.stop()
        caller_procs.stop()


@pytest.mark.parametrize("caller_class", [Caller, AsyncCaller])
def test_a_proc_dying_under_a_call_from_an_actor_fails_that_call(meshes, caller_class):
    # The actor was no client of the hub: the children's deaths reached the client alone,
    # and the actor's call waited its whole 60 s timeout (forever without one).
    children, caller_procs = meshes
    caller = caller_procs.spawn(f"caller_{caller_class.__name__.lower()}", caller_class)
    assert caller.call.call_one(children, "die").get(timeout=BOUND_S) == "raised SupervisionError"


def test_an_actor_calling_actors_whose_proc_died_before_it_joined_fails_at_once(meshes):
    # Deaths are told to the clients of the time: an actor that joins later, handed the
    # mesh, is told which of its actors are gone already.
    children, caller_procs = meshes
    with pytest.raises(Exception, match="SupervisionError|exited"):
        children.die.call().get(timeout=BOUND_S)
    caller = caller_procs.spawn("late_caller", Caller)
    assert caller.call.call_one(children, "ping").get(timeout=BOUND_S) == "raised SupervisionError"
