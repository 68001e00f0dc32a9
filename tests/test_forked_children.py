"""A child an endpoint forks (the textbook ``os.fork()`` … ``sys.exit(0)`` pattern, a
DataLoader's worker) never speaks for its parent's actor: however it leaves the
endpoint's code (``sys.exit``, an exception, a plain return), it exits there, with
the status Python would give it, and the parent's call returns what the parent returned."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from monarch_nb.actor import Actor, endpoint


BOUND_S = 30.0
CHILD_BOUND_S = 20.0  # how long the parent waits for its child (today's child never exits)


def _reap(pid: int) -> int | str:
    """The exit code of child ``pid`` (negative: killed by that signal), or ``"hung"``
    when it has not exited within ``CHILD_BOUND_S`` (then it is killed)."""
    deadline = time.monotonic() + CHILD_BOUND_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hung"


def _in_child(how: str):
    """What the forked child does to leave the endpoint's code."""
    if how == "exit0":
        sys.exit(0)
    if how == "exit3":
        sys.exit(3)
    if how == "raise":
        raise ValueError("raised in the forked child")
    if how == "base":
        raise KeyboardInterrupt
    print("child", os.getpid(), "leaves by returning", end="")  # an unfinished line goes out too
    return "the child's value"


class Forker(Actor):
    @endpoint
    def fork_and_reap(self, how: str):
        pid = os.fork()
        if pid == 0:
            return _in_child(how)
        return _reap(pid)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class AsyncForker(Actor):
    @endpoint
    async def fork_and_reap(self, how: str):
        pid = os.fork()
        if pid == 0:
            return _in_child(how)
        return _reap(pid)

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


class ForkerWithCleanup(Actor):
    """Has ``__cleanup__``: a terminated proc stops it first (``proc.__main__``)."""

    @endpoint
    def terminate_child(self) -> int:
        """Fork a child that waits, end it with SIGTERM once it waits, reap it."""
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            os.write(ready_w, b"w")
            time.sleep(CHILD_BOUND_S)
            os._exit(0)
        os.close(ready_w)
        os.read(ready_r, 1)  # the child is past its fork: signals are its own
        os.close(ready_r)
        os.kill(pid, signal.SIGTERM)
        return _reap(pid)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    def __cleanup__(self, exc) -> None:
        pass


@pytest.fixture(scope="module")
def procs(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="forkers")
    yield procs
    procs.stop()


EXIT_CODES = {"exit0": 0, "exit3": 3, "raise": 1, "base": 1, "return": 0}


@pytest.mark.parametrize("how", list(EXIT_CODES))
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_forked_child_leaving_the_endpoint_exits_and_never_speaks_for_its_actor(procs, faults, kind, how):
    mesh = procs.spawn(f"forker_{kind}_{how}", Forker if kind == "sync" else AsyncForker)
    try:
        assert mesh.fork_and_reap.call_one(how).get(timeout=BOUND_S) == EXIT_CODES[how]
        # The actor lives on (the child's copy of it reported no death), and serves the next call.
        assert mesh.pid.call_one().get(timeout=BOUND_S) == procs.pids[0]
        assert not faults, f"a forked child reported a fault for its parent: {faults}"
    finally:
        mesh.stop()


def test_a_forked_child_ended_by_sigterm_does_not_stop_its_parents_actors(procs):
    mesh = procs.spawn("forker_term", ForkerWithCleanup)
    try:
        assert mesh.terminate_child.call_one().get(timeout=BOUND_S) == -signal.SIGTERM
        # The child's copy of the proc's SIGTERM handler sent this actor a stop: it never answered.
        assert mesh.pid.call_one().get(timeout=BOUND_S) == procs.pids[0]
    finally:
        mesh.stop()
