"""Async actors: plain endpoints run one at a time in arrival order, even while they
await; ``@concurrent_endpoint`` calls interleave at their awaits; a stop cancels the
calls in progress and an interrupt reaches an awaiting call."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import wait_until

from monarch_nb.actor import (Actor, ActorError, MeshFailure, Port, SupervisionError, concurrent_endpoint,
                              endpoint, this_host)

BOUND_S = 20.0


class Gate(Actor):
    def __init__(self):
        self.ready = asyncio.Event()
        self.open = asyncio.Event()
        self.log: list = []

    @concurrent_endpoint
    async def wait(self) -> str:
        self.ready.set()
        await self.open.wait()
        return "done"

    @endpoint
    async def release_when_ready(self) -> str:
        await self.ready.wait()
        self.open.set()
        return "released"

    @endpoint
    async def step(self, i: int, delay: float) -> int:
        self.log.append(("start", i))
        await asyncio.sleep(delay)
        self.log.append(("end", i))
        return i

    @endpoint
    async def seen(self) -> list:
        return self.log

    @concurrent_endpoint(explicit_response_port=True)
    async def started_then_wait(self, port: Port, path: str) -> None:
        port.send("started")
        try:
            await self.open.wait()
        except asyncio.CancelledError:
            with open(path, "w") as f:
                f.write("cancelled")
            raise

    @endpoint
    async def sleep(self, seconds: float, started: str | None = None) -> str:
        if started:
            open(started, "w").close()  # the test interrupts once this call awaits
        await asyncio.sleep(seconds)
        return "slept"


@dataclass
class Ball:
    ttl: int
    sender: Any


class Player(Actor):
    def __init__(self):
        self.me = None
        self.received = 0

    @endpoint
    async def set_me(self, me) -> None:
        self.me = me

    @concurrent_endpoint
    async def ping(self, ball: Ball) -> None:
        self.received += 1
        if ball.ttl > 0:  # the other side calls back while this call awaits
            await ball.sender.ping.call(Ball(ball.ttl - 1, self.me))

    @endpoint
    async def count(self) -> int:
        return self.received


class Leaves(Actor):
    @endpoint
    def leave(self) -> None:
        raise SystemExit(3)


class AsyncOwner(Actor):
    def __init__(self):
        self.supervised = asyncio.Event()
        self.failures: list = []

    @endpoint
    async def spawn_and_await_supervision(self) -> list:
        child = this_host().spawn_procs(per_host={"gpus": 1}, name="owned_async").spawn("owned_async", Leaves)
        child.leave.broadcast()
        await asyncio.wait_for(self.supervised.wait(), BOUND_S)  # __supervise__ runs during this await
        return self.failures

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(f"{failure.kind} {failure.meshes}")
        self.supervised.set()
        return True


class AsyncSuperviseOwner(AsyncOwner):
    @endpoint
    async def loops(self) -> tuple:
        return id(asyncio.get_running_loop()), self.supervise_loop

    async def __supervise__(self, failure: MeshFailure) -> bool:
        await asyncio.sleep(0)
        self.supervise_loop = id(asyncio.get_running_loop())
        return super().__supervise__(failure)


class CleansUp(Actor):
    """Writes what happened to ``path``: its waiting call's cancellation, then __cleanup__."""

    def __init__(self, path: str):
        self.file = open(path, "w")
        self.open = asyncio.Event()

    @concurrent_endpoint(explicit_response_port=True)
    async def run(self, port: Port) -> None:
        port.send("started")
        try:
            await self.open.wait()
        finally:
            self.file.write("task_cancelled\n")
            self.file.flush()

    async def __cleanup__(self, exc) -> None:
        await asyncio.sleep(0)
        self.file.write(f"cleanup {exc}\n")
        self.file.close()


class SyncCleansUp(Actor):
    def __init__(self, path: str):
        self.path = path

    @endpoint
    def ping(self) -> str:
        return "pong"

    def __cleanup__(self, exc) -> None:
        with open(self.path, "w") as f:
            f.write(f"cleanup {exc}")


@pytest.fixture(scope="module")
def procs(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="concurrent1")
    yield procs
    procs.stop()


def test_a_concurrent_endpoint_runs_while_a_plain_one_is_called(procs):
    gate = procs.spawn("gate", Gate)
    waiting = gate.wait.call_one()
    assert gate.release_when_ready.call_one().get(timeout=BOUND_S) == "released"
    assert waiting.get(timeout=BOUND_S) == "done"


def test_plain_async_endpoints_run_one_at_a_time_in_order(procs):
    gate = procs.spawn("serial", Gate)
    first, second = gate.step.call_one(1, 0.3), gate.step.call_one(2, 0.0)
    assert (first.get(timeout=BOUND_S), second.get(timeout=BOUND_S)) == (1, 2)
    assert gate.seen.call_one().get(timeout=BOUND_S) == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]


def test_meshes_calling_each_other_back_through_concurrent_endpoints(host):
    left_procs = host.spawn_procs(per_host={"gpus": 1}, name="left")
    right_procs = host.spawn_procs(per_host={"gpus": 1}, name="right")
    try:
        left, right = left_procs.spawn("left", Player), right_procs.spawn("right", Player)
        left.set_me.call(left).get(timeout=BOUND_S)
        right.set_me.call(right).get(timeout=BOUND_S)
        right.ping.call(Ball(10, left)).get(timeout=BOUND_S)
        assert right.count.call_one().get(timeout=BOUND_S) == 6
        assert left.count.call_one().get(timeout=BOUND_S) == 5
    finally:
        left_procs.stop()
        right_procs.stop()


def test_supervise_runs_while_the_owners_async_endpoint_awaits(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="async_owner")
    try:
        owner = procs.spawn("async_owner", AsyncOwner)
        assert owner.spawn_and_await_supervision.call_one().get(timeout=60) == ["actor_failed ('owned_async',)"]
    finally:
        procs.stop()


def test_an_async_supervise_is_awaited_on_the_actors_loop(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="async_supervise")
    try:
        owner = procs.spawn("async_supervise", AsyncSuperviseOwner)
        assert owner.spawn_and_await_supervision.call_one().get(timeout=60) == ["actor_failed ('owned_async',)"]
        endpoint_loop, supervise_loop = owner.loops.call_one().get(timeout=BOUND_S)
        assert endpoint_loop == supervise_loop
    finally:
        procs.stop()


def test_a_stop_cancels_the_concurrent_calls_in_progress(host, tmp_path):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="stopped_concurrent")
    gate = procs.spawn("cancelled", Gate)
    path = tmp_path / "done"
    assert gate.started_then_wait.call_one(str(path)).get(timeout=BOUND_S) == "started"
    plain = gate.sleep.call_one(60)
    t0 = time.monotonic()
    gate.stop()
    assert path.read_text() == "cancelled"
    with pytest.raises((ActorError, SupervisionError), match="stopped"):
        plain.get(timeout=BOUND_S)
    assert time.monotonic() - t0 < BOUND_S
    procs.stop()


def test_stopping_the_procs_cancels_the_async_calls_in_progress(host, tmp_path):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="terminated_concurrent")
    gate = procs.spawn("terminated", Gate)
    path = tmp_path / "done"
    assert gate.started_then_wait.call_one(str(path)).get(timeout=BOUND_S) == "started"
    procs.stop()
    assert path.read_text() == "cancelled"


def test_stopping_the_procs_cancels_calls_then_runs_cleanup(host, tmp_path):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="cleanup_procs")
    path = tmp_path / "log"
    actor = procs.spawn("cleans_up", CleansUp, str(path))
    assert actor.run.call_one().get(timeout=BOUND_S) == "started"
    procs.stop()
    assert path.read_text() == "task_cancelled\ncleanup None\n"


def test_stopping_a_sync_actor_runs_its_cleanup(procs, tmp_path):
    path = tmp_path / "log"
    actor = procs.spawn("sync_cleans_up", SyncCleansUp, str(path))
    assert actor.ping.call_one().get(timeout=BOUND_S) == "pong"
    actor.stop()
    assert path.read_text() == "cleanup None"


def test_an_interrupt_reaches_an_awaiting_async_endpoint(procs, tmp_path):
    gate = procs.spawn("interrupted", Gate)
    started = tmp_path / "started"
    sleeping = gate.sleep.call_one(60, str(started))
    assert wait_until(started.exists, BOUND_S)
    procs.interrupt()
    with pytest.raises(ActorError, match="KeyboardInterrupt"):
        sleeping.get(timeout=BOUND_S)
    assert gate.sleep.call_one(0).get(timeout=BOUND_S) == "slept"  # the actor carries on


def test_a_concurrent_endpoint_answers_through_its_port_before_returning(procs):
    gate = procs.spawn("ported", Gate)
    assert gate.started_then_wait.call_one("/dev/null").get(timeout=BOUND_S) == "started"
    assert gate.sleep.call_one(0).get(timeout=BOUND_S) == "slept"  # not blocked by the waiting call


def test_concurrent_endpoint_needs_an_async_method_and_no_endpoint_under_it():
    with pytest.raises(ValueError, match="async"):
        concurrent_endpoint(lambda self: None)
    with pytest.raises(ValueError, match="does not wrap @endpoint"):
        async def ping(self):
            return "pong"
        concurrent_endpoint(endpoint(ping))
