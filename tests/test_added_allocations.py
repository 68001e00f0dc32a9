"""Hosts added to a running cluster from allocations of their own (``Cluster.allocate``):
they serve spawns and calls, show in health, are given back alone with
``HostMesh.shutdown()`` (their procs and agents gone, the rest untouched), survive a
hub crash and recovery, and end with the cluster. Local allocations here; Slurm jobs
per allocation in test_slurm.py."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys

import psutil
import pytest

import monarch_nb
from monarch_nb.actor import Actor, SupervisionError, endpoint
from monarch_nb.allocators.local import LocalHosts
from monarch_nb.allocators.slurm import SlurmAllocator
from monarch_nb.client.cluster import Cluster
from monarch_nb.client.runtime import runtime
from monarch_nb.errors import ClusterNotFound

from conftest import cluster_processes, pids_alive, wait_until

_names = itertools.count()


class Where(Actor):
    def __init__(self):
        self.calls = 0

    @endpoint
    def pid(self) -> int:
        self.calls += 1
        return os.getpid()

    @endpoint
    def count(self) -> int:
        return self.calls


@pytest.fixture
def cluster():
    """A retained one-host cluster of its own, stopped afterwards: nothing of it, added
    allocations included, may be left running or on disk."""
    name = f"added{next(_names)}"
    started = Cluster.start(name, hosts=1, grace_s=30)
    yield started
    try:
        monarch_nb.connect(name).stop()
    except ClusterNotFound:
        pass
    assert wait_until(lambda: not cluster_processes(started.path), 10), cluster_processes(started.path)
    assert not started.path.exists()


def agent_pids(cluster: Cluster, name: str) -> list[int]:
    return [h["pid"] for h in cluster.info()["allocations"][name]["hosts"]]


def test_added_hosts_run_procs_and_are_given_back_alone(cluster):
    main = cluster.this_host().spawn_procs(per_host={"gpus": 1}).spawn("main", Where)
    group = cluster.allocate("g0", hosts=2)
    assert dict(group.extent) == {"hosts": 2}
    assert cluster.allocate("g0", hosts=2)._hosts == group._hosts  # a re-run cell gets the same hosts
    added = group.spawn_procs(per_host={"gpus": 2}).spawn("added", Where)
    pids = added.pid.call().get(timeout=60).values()
    assert len(set(pids)) == 4
    agents = agent_pids(cluster, "g0")
    health = {h["host_id"]: h["state"] for h in cluster.health()["hosts"]}
    assert health == {"host0": "healthy", "g0-host0": "healthy", "g0-host1": "healthy"}
    assert [h["host_id"] for h in cluster.info()["hosts"]] == ["host0"]  # the cluster's own hosts

    group.shutdown()
    assert not pids_alive(pids + agents)
    assert cluster.allocations == {}
    assert [h["host_id"] for h in cluster.health()["hosts"]] == ["host0"]
    with pytest.raises(SupervisionError, match="stopped"):
        added.pid.call().get(timeout=30)
    assert main.count.call_one().get(timeout=30) == 0  # the rest of the cluster runs on
    assert len(cluster.allocate("g0", hosts=1).spawn_procs().spawn("again", Where).pid.call().get(timeout=60)) == 1


def test_bad_allocations_are_refused_and_leave_the_cluster_healthy(cluster):
    cluster.allocate("g1")
    with pytest.raises(ValueError, match="'g1' exists .*1 host"):
        cluster.allocate("g1", hosts=2)
    with pytest.raises(ValueError, match="'g1' exists .*from the local allocator"):  # not the local hosts
        cluster.allocate("g1", allocator=SlurmAllocator(nodes=1, partition="none"))
    with pytest.raises(ValueError, match="letters, digits"):
        cluster.allocate("no spaces")
    with pytest.raises(ValueError, match="hosts=0"):
        cluster.allocate("g2", hosts=0)
    with pytest.raises(TypeError, match="give an allocator"):
        cluster.allocate("g2", allocator="slurm")
    with pytest.raises(TypeError, match="an instance, not the class"):
        cluster.allocate("g2", allocator=LocalHosts)
    with pytest.raises(ValueError, match="no allocation named 'nope'"):
        from monarch_nb.client.allocations import release
        release(cluster.hub, "nope")
    assert list(cluster.allocations) == ["g1"]
    assert cluster.allocations["g1"].spawn_procs().spawn("w", Where).count.call_one().get(timeout=60) == 0


def test_a_lost_added_host_fails_its_procs_only(cluster):
    main = cluster.this_host().spawn_procs(per_host={"gpus": 1}).spawn("main", Where)
    group = cluster.allocate("g0", hosts=1)
    added = group.spawn_procs(per_host={"gpus": 1}).spawn("added", Where)
    added.pid.call_one().get(timeout=60)
    os.kill(agent_pids(cluster, "g0")[0], signal.SIGKILL)
    assert wait_until(lambda: {h["host_id"]: h["state"] for h in cluster.health()["hosts"]}
                      == {"host0": "healthy", "g0-host0": "failed"}, 10), cluster.health()["hosts"]
    with pytest.raises(SupervisionError):
        added.pid.call_one().get(timeout=30)
    assert main.count.call_one().get(timeout=30) == 0
    group.shutdown()  # giving back a failed allocation: nothing waits for its dead agent
    assert cluster.allocations == {}


def test_a_recovered_hub_keeps_added_allocations_and_stop_ends_them(cluster):
    group = cluster.allocate("g0", hosts=1)
    added = group.spawn_procs(per_host={"gpus": 1}).spawn("added", Where)
    pid = added.pid.call_one().get(timeout=60)
    agents = agent_pids(cluster, "g0")
    os.kill(cluster._info["hub_pid"], signal.SIGKILL)
    assert wait_until(lambda: not psutil.pid_exists(cluster._info["hub_pid"]), 10)
    runtime().cluster = None
    recovered = Cluster.recover(cluster.name)
    assert agent_pids(recovered, "g0") == agents
    assert recovered.actor_meshes["added"].pid.call_one().get(timeout=60) == pid
    assert added.count.call_one().get(timeout=60) == 2  # the handle held from before the crash too
    recovered.allocations["g0"].shutdown()
    assert not pids_alive([pid, *agents])


def test_cluster_stop_of_a_dead_hub_ends_the_added_allocations(cluster):
    group = cluster.allocate("g0", hosts=1)
    pid = group.spawn_procs(per_host={"gpus": 1}).spawn("added", Where).pid.call_one().get(timeout=60)
    agents = agent_pids(cluster, "g0")
    os.kill(cluster._info["hub_pid"], signal.SIGKILL)
    done = subprocess.run([sys.executable, "-m", "monarch_nb.cli", "cluster", "stop", cluster.name],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert wait_until(lambda: not pids_alive([pid, *agents]), 10)
