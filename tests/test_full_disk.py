"""A full disk under the cluster directory (hub.log, the log store, the state file and
the constructor payloads are all on it): the hub keeps serving and says what it loses,
spawn answers with an error, the heartbeats of the hub and host agents outlive it, and
everything resumes when space returns.

The cluster's home is a small tmpfs mounted for the test (root only; elsewhere a
missing system part), filled with a file and freed by removing it."""

from __future__ import annotations

import errno
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from monarch_nb import cluster_dir
from monarch_nb.actor import Actor, ClusterError, endpoint
from monarch_nb.client.cluster import Cluster
from monarch_nb.client.launch import launch_hub
from monarch_nb.client.runtime import runtime

from conftest import HOME_PREFIX, cluster_processes, pids_alive, system_part_missing, wait_until

_names = itertools.count()
TMPFS_SIZE = "32m"


class Echo(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def say(self, text: str, times: int = 1) -> None:
        for i in range(times):
            print(f"{text} {i}", flush=True)


class Disk:
    """The tmpfs the cluster's home is on: ``fill()`` it, ``free()`` it."""

    def __init__(self, path: Path):
        self.path = path
        self.filler = path / "filler"

    def fill(self) -> None:
        with open(self.filler, "ab", buffering=0) as f:
            for size in (1 << 20, 4096, 1):
                try:
                    while True:
                        f.write(b"\0" * size)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def on_tmpfs(monkeypatch):
    """``start(grace_s)``: a retained cluster whose home is a fresh small tmpfs; returns
    (cluster, disk). Every cluster is stopped and the tmpfs unmounted afterwards."""
    if os.geteuid() != 0:
        system_part_missing("mounting a tmpfs needs root")
    # Named like the run's home: a proc importing conftest keeps it (see conftest).
    mount = Path(tempfile.mkdtemp(prefix=HOME_PREFIX + "tmpfs-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        mount.rmdir()
        system_part_missing(f"could not mount a tmpfs: {done.stderr.strip()}")
    monkeypatch.setenv("MONARCH_NB_HOME", str(mount))
    disk = Disk(mount)
    started: list[Cluster] = []

    def start(grace_s: float = 30.0) -> tuple[Cluster, Disk]:
        name = f"fulldisk-{os.getpid()}-{next(_names)}"
        path, _ = cluster_dir.create(name)
        launch_hub(path, hosts=1, grace_s=grace_s)
        c = Cluster(name, path, cluster_dir.read_info(path))._attach()
        started.append(c)
        return c, disk

    try:
        yield start
    finally:
        disk.free()
        for c in started:
            for p in cluster_processes(c.path):
                try:
                    p.resume()  # a test that failed while the hub was stopped
                except psutil.Error:
                    pass
            c.stop()
            assert wait_until(lambda: not cluster_processes(c.path), 30), cluster_processes(c.path)
        if runtime().cluster is not None:
            runtime().cluster.disconnect()
            runtime().cluster = None
        subprocess.run(["umount", str(mount)], check=True)
        mount.rmdir()


def _store(c: Cluster) -> dict:
    return c.info()["hub_stats"]["log_store"]


def test_with_the_disk_full_the_store_says_it_fails_spawn_answers_and_all_resumes_when_freed(on_tmpfs):
    c, disk = on_tmpfs()
    procs = c.host_mesh().spawn_procs(per_host={"gpus": 2}, name="p")
    mesh = procs.spawn("echo", Echo)
    pids = mesh.pid.call().get(timeout=60).values()
    disk.fill()
    mesh.say.call("full", 500).get(timeout=60)
    # The store says it is failing (not "ok" for ever), and why.
    assert wait_until(lambda: not _store(c)["ok"], 60), _store(c)
    assert "full" in _store(c)["error"], _store(c)
    # A spawn answers, with an error that names the problem and the fix (it waited for ever).
    with pytest.raises(ClusterError, match="free space there and spawn it again"):
        procs.spawn("more", Echo, init_timeout=120)
    # The hub serves on: calls, health, logs from its ring.
    assert mesh.pid.call().get(timeout=60).values() == pids
    assert wait_until(lambda: len(c.logs(mesh="echo", grep="^full ")) == 1000, 60)
    assert c.health()["counts"]["alive"] == 2
    # Space returns: the store writes again, what it kept included; spawn works.
    disk.free()
    assert wait_until(lambda: _store(c)["ok"] and _store(c)["unwritten"] == 0, 60), _store(c)
    assert _store(c)["lost"] == 0 and _store(c)["lines"] >= 1000, _store(c)
    assert procs.spawn("more", Echo).pid.call().get(timeout=60).values() != []
    assert c.info()["hub_stats"]["notices_lost"] >= 1  # what hub.log could not take is counted


def _client(name: str) -> subprocess.Popen:
    """Another client of cluster ``name``, connected until it is killed."""
    code = ("import sys, time, monarch_nb; monarch_nb.connect(sys.argv[1]); print('connected', flush=True); "
            "time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code, name], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "connected"
    return child


def test_a_hub_stalled_with_the_disk_full_still_expires_a_killed_client_once_space_returns(on_tmpfs):
    c, disk = on_tmpfs()
    hub = psutil.Process(c.info()["hub_pid"])
    disk.fill()
    hub.suspend()
    try:
        time.sleep(2.5)  # the stall itself (past the hub's 1 s stall threshold), not a wait for a condition
    finally:
        hub.resume()
    # Its stall notice could not be written to hub.log: the heartbeat loop must go on.
    assert wait_until(lambda: c.info()["hub_stats"]["stalls"] >= 1, 60)
    disk.free()
    other = _client(c.name)
    try:
        assert wait_until(lambda: any(x["pid"] == other.pid for x in c.info()["clients"]), 60)
        other.kill()
        other.wait()
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()
    # The hub's heartbeat forgets a client whose process is gone.
    assert wait_until(lambda: not any(x["pid"] == other.pid for x in c.info()["clients"]), 60), c.info()["clients"]


def test_a_host_agent_whose_hub_falls_silent_with_the_disk_full_still_stops_its_procs(on_tmpfs):
    c, disk = on_tmpfs(grace_s=3.0)
    mesh = c.host_mesh().spawn_procs(per_host={"gpus": 2}, name="p").spawn("echo", Echo)
    pids = mesh.pid.call().get(timeout=60).values()
    agent = c.info()["hosts"][0]["pid"]
    hub = psutil.Process(c.info()["hub_pid"])
    disk.fill()
    hub.suspend()
    try:
        # Its "hub silent" notice can't be written: the agent stops every proc and exits
        # all the same (its heartbeat ended instead, leaving the procs for ever).
        assert wait_until(lambda: not pids_alive([agent, *pids]), 60), pids_alive([agent, *pids])
    finally:
        hub.resume()
        disk.free()
