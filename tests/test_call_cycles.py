"""A call that waits on its own actor, directly or around a cycle, fails at once with
``CallCycleError`` naming the cycle (Monarch hangs for good), and the actors stay usable;
calls that can't deadlock (not waited on, or to a concurrent endpoint) still work."""

from __future__ import annotations

import pytest

from monarch_nb.actor import Actor, ActorError, CallCycleError, concurrent_endpoint, endpoint

from conftest import wait_until

BOUND_S = 20.0  # a generous bound: on the old code these calls never end


class Caller(Actor):
    def __init__(self):
        self.me = None
        self.peer = None
        self.pings = 0

    @endpoint
    def introduce(self, me, peer=None) -> None:
        self.me, self.peer = me, peer

    @endpoint
    def ping(self) -> int:
        self.pings += 1
        return self.pings

    @endpoint
    def count(self) -> int:
        return self.pings

    @endpoint
    def ping_myself(self) -> int:
        return self.me.ping.call_one().get()

    @endpoint
    def ping_myself_later(self) -> str:
        self.me.ping.broadcast()  # not waited on: runs once this call is over
        return "sent"

    @endpoint
    def ask_peer(self) -> int:
        return self.peer.ping_back.call_one().get()

    @endpoint
    def ping_back(self) -> int:
        return self.peer.ping.call_one().get()


class AsyncCaller(Actor):
    def __init__(self):
        self.me = None

    @endpoint
    async def introduce(self, me) -> None:
        self.me = me

    @endpoint
    async def ping(self) -> str:
        return "pong"

    @endpoint
    async def await_myself(self) -> str:
        return await self.me.ping.call_one()

    @concurrent_endpoint
    async def await_myself_concurrently(self) -> str:
        return await self.me.ping.call_one()


@pytest.fixture(scope="module")
def procs(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="cycles")
    yield procs
    procs.stop()


def _cycle_of(error: ActorError) -> CallCycleError:
    """The CallCycleError at the root of a (possibly nested) ActorError."""
    cause = error.exception
    while isinstance(cause, ActorError):
        cause = cause.exception
    assert isinstance(cause, CallCycleError), f"not a call cycle: {error}"
    return cause


def test_an_endpoint_waiting_on_its_own_actor_fails_at_once_and_the_actor_lives_on(procs):
    me = procs.spawn("selfish", Caller)
    me.introduce.call(me).get(timeout=BOUND_S)
    with pytest.raises(ActorError) as failed:
        me.ping_myself.call_one().get(timeout=BOUND_S)
    cycle = _cycle_of(failed.value)
    assert cycle.cycle == ["selfish[0]"]
    assert "selfish[0] → selfish[0]" in str(cycle) and "one call at a time" in str(cycle)
    # The actor serves on, and the self-call it sent runs once it is free (the two
    # pings come from two senders: either may arrive first).
    assert me.ping.call_one().get(timeout=BOUND_S) in (1, 2)
    assert wait_until(lambda: me.count.call_one().get(timeout=BOUND_S) == 2, BOUND_S)


def test_a_cycle_between_two_actors_fails_at_once_naming_it(host):
    procs_a = host.spawn_procs(per_host={"gpus": 1}, name="cycle_a")
    procs_b = host.spawn_procs(per_host={"gpus": 1}, name="cycle_b")
    try:
        a, b = procs_a.spawn("a", Caller), procs_b.spawn("b", Caller)
        a.introduce.call(a, b).get(timeout=BOUND_S)
        b.introduce.call(b, a).get(timeout=BOUND_S)
        with pytest.raises(ActorError) as failed:
            a.ask_peer.call_one().get(timeout=BOUND_S)
        cycle = _cycle_of(failed.value)
        assert cycle.cycle == ["a[0]", "b[0]"]
        assert "a[0] → b[0] → a[0]" in str(cycle)
        assert a.ping.call_one().get(timeout=BOUND_S) >= 1
        assert b.ping.call_one().get(timeout=BOUND_S) == 1
    finally:
        procs_a.stop()
        procs_b.stop()


def test_a_call_to_its_own_actor_not_waited_on_still_runs(procs):
    me = procs.spawn("patient", Caller)
    me.introduce.call(me).get(timeout=BOUND_S)
    assert me.ping_myself_later.call_one().get(timeout=BOUND_S) == "sent"
    assert wait_until(lambda: me.count.call_one().get(timeout=BOUND_S) == 1, BOUND_S)


def test_an_async_endpoint_awaiting_its_own_actor_fails_unless_concurrent(procs):
    me = procs.spawn("async_selfish", AsyncCaller)
    me.introduce.call(me).get(timeout=BOUND_S)
    with pytest.raises(ActorError) as failed:
        me.await_myself.call_one().get(timeout=BOUND_S)
    assert _cycle_of(failed.value).cycle == ["async_selfish[0]"]
    # A concurrent endpoint leaves the actor free to serve the call it awaits.
    assert me.await_myself_concurrently.call_one().get(timeout=BOUND_S) == "pong"
