"""inject_fault: each kind is the real fault, seen by supervision and callers as if it
had happened on its own, in the ranks chosen and no others."""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from monarch_nb import Cluster
from monarch_nb.actor import Actor, endpoint, this_proc
from monarch_nb.errors import ActorError, SupervisionError
from monarch_nb.ft import FAULTS, InjectedFault, inject_fault
from conftest import cluster_processes, pids_alive, wait_until

BOUND_S = 60


class Worker(Actor):
    @endpoint
    def pid(self) -> int:
        import os
        return os.getpid()

    @endpoint
    def step(self, started: str) -> str:
        import pathlib
        pathlib.Path(started).touch()
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:  # a long step, in Python: an exception lands at once
            sum(range(1000))
        return "finished"


@pytest.fixture
def workers(cluster):
    procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 3})
    yield procs, procs.spawn("w", Worker)
    procs.stop()


@pytest.mark.parametrize("kind, signal_number", [("kill", signal.SIGKILL), ("segfault", signal.SIGSEGV)])
def test_a_crash_fails_calls_to_that_rank_only_and_says_how_it_died(workers, kind, signal_number):
    procs, mesh = workers
    pids = mesh.pid.call().get(timeout=BOUND_S).values()
    assert inject_fault(mesh, kind, ranks=[1]) == [1]
    assert wait_until(lambda: pids_alive([pids[1]]) == [], BOUND_S)
    with pytest.raises(SupervisionError, match=signal.Signals(signal_number).name):
        mesh.slice(gpus=1).pid.call_one().get(timeout=BOUND_S)
    assert [mesh.slice(gpus=r).pid.call_one().get(timeout=BOUND_S) for r in (0, 2)] == [pids[0], pids[2]]


def test_a_hung_rank_is_alive_answers_nothing_and_shows_unresponsive(cluster, workers):
    procs, mesh = workers
    pid = mesh.slice(gpus=2).pid.call_one().get(timeout=BOUND_S)
    inject_fault(procs, "hang", ranks=[2])
    try:
        assert wait_until(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, BOUND_S)
        with pytest.raises(TimeoutError):
            mesh.slice(gpus=2).pid.call_one().get(timeout=1)
        def state() -> str:
            return {p["pid"]: p["state"] for h in cluster.health()["hosts"] for p in h["procs"]}[pid]

        # Within a status's freshness (2 s of the spawn's, 2.5 s of a heartbeat's: docs/scale.md).
        assert wait_until(lambda: state() == "unresponsive", BOUND_S), state()
        assert mesh.slice(gpus=0).pid.call_one().get(timeout=BOUND_S)  # the others carry on
    finally:
        psutil.Process(pid).kill()  # a stopped process takes SIGKILL: nothing is left hung


def test_an_exception_lands_in_the_running_step_and_the_actor_carries_on(workers, tmp_path):
    procs, mesh = workers
    started = tmp_path / "started"
    step = mesh.slice(gpus=0).step.call_one(str(started))
    assert wait_until(started.exists, BOUND_S)
    inject_fault(mesh, "exception", ranks=[0])
    with pytest.raises(ActorError) as raised:
        step.get(timeout=BOUND_S)
    assert isinstance(raised.value.exception, InjectedFault) or "InjectedFault" in str(raised.value)
    assert mesh.slice(gpus=0).pid.call_one().get(timeout=BOUND_S)  # the actor lives on


def test_a_host_fault_takes_the_agent_and_every_proc_of_that_host(tmp_path):
    c = Cluster.start_ephemeral(hosts=2)
    try:
        procs = c.host_mesh().spawn_procs(per_host={"gpus": 2})
        mesh = procs.spawn("w", Worker)
        by_host = mesh.pid.call().get(timeout=BOUND_S)
        agents = {h["host_id"]: h["pid"] for h in c.info()["hosts"]}
        assert inject_fault(procs, "host", ranks=[0, 1]) == [0, 1]  # both on host 0: sent once
        lost = [procs.pids[0], procs.pids[1], agents["host0"]]
        assert wait_until(lambda: pids_alive(lost) == [], BOUND_S), pids_alive(lost)
        with pytest.raises(SupervisionError):
            mesh.slice(hosts=0).pid.call().get(timeout=BOUND_S)
        assert mesh.slice(hosts=1).pid.call().get(timeout=BOUND_S).values() == by_host.values()[2:]
    finally:
        c.stop()
    assert wait_until(lambda: not cluster_processes(c.path), 15), cluster_processes(c.path)


def test_bad_requests_are_refused_with_what_to_do_and_nothing_is_sent(workers):
    procs, mesh = workers
    with pytest.raises(ValueError, match="unknown fault 'oom'.*'kill'"):
        inject_fault(mesh, "oom")
    with pytest.raises(ValueError, match=r"rank\(s\) \[3\] outside this mesh of 3"):
        inject_fault(procs, "kill", ranks=[0, 3])
    with pytest.raises(ValueError, match="this_proc"):
        inject_fault(this_proc(), "kill")
    assert len(mesh.pid.call().get(timeout=BOUND_S)) == 3  # nobody was hit
    assert set(FAULTS) == {"kill", "segfault", "hang", "exception", "host", "router"}
