"""A host whose agent is starved of CPU, or stopped for a while, is not a lost host for
good: the hub takes it back with its procs when it is heard again, and no client
waits without a bound meanwhile (a spawn whose procs go away answers at once)."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from monarch_nb.actor import Actor, ClusterError, endpoint
from monarch_nb.client.cluster import Cluster

from conftest import cluster_processes, wait_until


class Slow(Actor):
    def __init__(self, seconds: float):
        print("constructing", flush=True)
        time.sleep(seconds)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture
def cluster():
    c = Cluster.start_ephemeral(grace_s=60.0)
    yield c
    for p in cluster_processes(c.path):
        try:
            p.resume()  # a test that failed while something was stopped
        except psutil.Error:
            pass
    c.stop()
    assert wait_until(lambda: not cluster_processes(c.path), 30), cluster_processes(c.path)


def _kill_when_constructing(c: Cluster, pid: int) -> threading.Thread:
    def kill():
        if wait_until(lambda: c.logs(mesh="slow", grep="constructing"), 60):
            os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def test_a_spawn_whose_proc_dies_during_init_answers_with_the_cause(cluster):
    procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 2}, name="p")
    killer = _kill_when_constructing(cluster, procs.pids[1])
    # (init_timeout only bounds this test on code where the hub never answered)
    with pytest.raises(ClusterError, match=r"actor mesh 'slow' was not created: proc p/1 .* killed by SIGKILL"):
        procs.spawn("slow", Slow, 600.0, init_timeout=120)
    killer.join()
    # The other rank's constructor was stopped; the live proc takes a new mesh.
    assert procs.slice(gpus=0).spawn("pid", Pid).pid.call_one().get(timeout=60) == procs.pids[0]
