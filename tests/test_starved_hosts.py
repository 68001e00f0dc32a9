"""A host whose agent is starved of CPU, or stopped for a while, is not a lost host for
good: the hub takes it back with its procs when it is heard again, and no client
waits without a bound meanwhile (a spawn whose procs go away answers at once)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from monarch_nb import cluster_dir
from monarch_nb.actor import Actor, ClusterError, endpoint
from monarch_nb.client.cluster import Cluster
from monarch_nb.client.launch import HUB_LOG, launch_hub
from monarch_nb.hub.heartbeats import HOST_TIMEOUT_S
from monarch_nb.starvation import counted_silence, cpu_wait

from conftest import cluster_processes, pids_alive, system_part_missing, wait_until

_names = itertools.count()


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


@pytest.fixture
def retained():
    """``start(grace_s)``: a retained cluster (hub.log in its directory), stopped afterwards."""
    started: list[Cluster] = []

    def start(grace_s: float = 60.0) -> Cluster:
        name = f"starved-{os.getpid()}-{next(_names)}"
        path, _ = cluster_dir.create(name)
        launch_hub(path, hosts=1, grace_s=grace_s)
        c = Cluster(name, path, cluster_dir.read_info(path))._attach()
        started.append(c)
        return c

    yield start
    for c in started:
        for p in cluster_processes(c.path):
            try:
                p.resume()
            except psutil.Error:
                pass
        c.stop()
        assert wait_until(lambda: not cluster_processes(c.path), 30), cluster_processes(c.path)


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller (CFS bandwidth)


@pytest.fixture
def starve():
    """``starve(pid)``: put process ``pid`` in a CPU cgroup allowed 1 ms of CPU a second,
    shared with 3 busy loops: runnable, it waits seconds for a CPU, as on a machine whose
    load is many times its cores. Undone afterwards."""
    if os.geteuid() != 0 or not (CPU_CGROUP / "cpu.cfs_quota_us").exists():
        system_part_missing("a cgroup v1 cpu controller, writable as root, to starve a process")
    group = CPU_CGROUP / f"monarch-nb-test-{os.getpid()}-{next(_names)}"
    group.mkdir()
    hogs: list[subprocess.Popen] = []

    def put(pid: int) -> None:
        (group / "cgroup.procs").write_text(str(pid))

    def start(pid: int) -> None:
        (group / "cpu.cfs_period_us").write_text("1000000")
        (group / "cpu.cfs_quota_us").write_text("1000")
        for _ in range(3):
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            hogs.append(hog)
            put(hog.pid)
        put(pid)

    try:
        yield start
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        for task in (group / "tasks").read_text().split():
            try:
                (CPU_CGROUP / "tasks").write_text(task)
            except OSError:
                pass  # exited meanwhile
        group.rmdir()


def test_the_silence_of_an_agent_waiting_for_a_cpu_is_not_counted():
    # Runnable now, having run 0.1 s of 10 s of silence: it waited the other 9.9 s.
    assert counted_silence(10.0, cpu_wait(10.0, (5.0, 1.0), (5.1, 1.0, True))) == pytest.approx(0.1)
    # Sleeping now, its waits ended: those count as waiting (4 s of 10).
    assert counted_silence(10.0, cpu_wait(10.0, (5.0, 1.0), (5.0, 5.0, False))) == pytest.approx(6.0)
    # Stopped or hung: it neither ran nor waited; all of its silence counts.
    assert counted_silence(10.0, cpu_wait(10.0, (5.0, 1.0), (5.0, 1.0, False))) == pytest.approx(10.0)
    # Busy (a loop that never sends): running is not waiting.
    assert counted_silence(10.0, cpu_wait(10.0, (5.0, 1.0), (15.0, 1.0, True))) == pytest.approx(10.0)


_SPINS_OFF_THE_MAIN_THREAD = """
import sys, threading
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
print("spinning", flush=True)
sys.stdin.read()  # the main thread sleeps (on its read, then on the GIL)
"""


def test_a_process_runs_and_is_runnable_on_any_of_its_threads_not_only_its_main_one():
    # A hub's event loop sleeps on the GIL while another of its threads holds it and
    # waits for a CPU: counted on the main thread alone, that silence went unexcused.
    from monarch_nb.starvation import sched_times

    child = subprocess.Popen([sys.executable, "-c", _SPINS_OFF_THE_MAIN_THREAD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "spinning\n"
        assert wait_until(lambda: sched_times(child.pid)[0] > 0.3, 30), sched_times(child.pid)
        with open(f"/proc/{child.pid}/schedstat") as f:  # the main thread's own
            assert int(f.read().split()[0]) / 1e9 < sched_times(child.pid)[0] / 2
        assert sched_times(child.pid)[2]  # the spinning thread is runnable, the main one asleep
    finally:
        child.kill()
        child.wait()
    assert sched_times(child.pid) is None


def test_a_host_agent_starved_of_cpu_is_not_lost_and_its_procs_keep_working(retained, starve):
    c = retained()
    mesh = c.host_mesh().spawn_procs(per_host={"gpus": 2}, name="p").spawn("pid", Pid)
    pids = mesh.pid.call().get(timeout=60).values()
    starve(c.info()["hosts"][0]["pid"])
    # Silent past the hub's timeout, waiting for a CPU: starved, not lost.
    assert wait_until(lambda: (lambda h: h["lost"] or h.get("starved", 0) >= 1)(c.info()["hosts"][0]), 120)
    host = c.info()["hosts"][0]
    assert not host["lost"] and host["silent_s"] > HOST_TIMEOUT_S, host
    assert mesh.pid.call().get(timeout=60).values() == pids  # its procs were never failed
    assert "its procs are lost" not in (c.path / HUB_LOG).read_text(errors="replace")


def test_a_hub_starved_of_cpu_is_not_gone_for_its_agent_and_the_procs_live_on(retained, starve):
    # A host agent stops every proc once the hub was silent for the grace period (2 s in
    # an ephemeral cluster). On a starved machine a live hub goes unheard that long: its
    # agent stopped every proc of a healthy cluster, and every call failed ("proc ... was
    # stopped").
    c = retained(grace_s=2.0)
    hub_pid = c.info()["hub_pid"]
    mesh = c.host_mesh().spawn_procs(per_host={"gpus": 2}, name="p").spawn("pid", Pid)
    pids = mesh.pid.call().get(timeout=60).values()
    starve(hub_pid)
    try:
        log = c.path / HUB_LOG
        # Silent past the grace period, waiting for a CPU: starved, not gone.
        assert wait_until(lambda: "the hub is not gone" in log.read_text(errors="replace"), 60), log.read_text()
        assert mesh.pid.call().get(timeout=60).values() == pids  # calls go straight to the procs
        assert "stopping every proc" not in log.read_text(errors="replace")
    finally:
        (CPU_CGROUP / "cgroup.procs").write_text(str(hub_pid))  # the fixture's stop needs the hub


def test_spawning_on_a_host_lost_while_its_agent_is_stopped_says_it_may_come_back(retained):
    c = retained()
    procs = c.host_mesh().spawn_procs(per_host={"gpus": 1}, name="p")
    agent = psutil.Process(c.info()["hosts"][0]["pid"])
    agent.suspend()
    try:
        assert wait_until(lambda: c.info()["hosts"][0]["lost"], 60)
        with pytest.raises(ClusterError, match="taken back with its procs: try again then"):
            c.host_mesh().spawn_procs(per_host={"gpus": 1}, name="q")
    finally:
        agent.resume()
    assert wait_until(lambda: not c.info()["hosts"][0]["lost"], 60)
    assert procs.spawn("pid", Pid).pid.call_one().get(timeout=60) == procs.pids[0]
    c.host_mesh().spawn_procs(per_host={"gpus": 1}, name="q").stop()


def test_stopping_procs_on_a_host_lost_while_its_agent_is_stopped_returns_at_once_and_they_stop_later(retained):
    # The hub asked the silent agent and waited STOP_TIMEOUT_S (10 s) for its answer, and
    # so did the user's procs.stop(), before respawning elsewhere (Slurm, routers on: 10.01 s).
    c = retained()
    procs = c.host_mesh().spawn_procs(per_host={"gpus": 2}, name="p")
    agent = psutil.Process(c.info()["hosts"][0]["pid"])
    agent.suspend()
    try:
        assert wait_until(lambda: c.info()["hosts"][0]["lost"], 60)
        started = time.monotonic()
        procs.stop()
        stopped_s = time.monotonic() - started
    finally:
        agent.resume()
    assert stopped_s < 5.0, f"procs.stop() took {stopped_s:.1f} s"
    assert wait_until(lambda: not pids_alive(procs.pids), 60)  # stopped once the agent ran again: no orphan


def test_an_agent_on_the_hubs_machine_excuses_its_cpu_waits_before_any_hub_alive(tmp_path):
    # The hub's pid came only with its first HUB_ALIVE. A spawn's load starved the hub
    # before that reached a new agent, whose hub silence then all counted: under 16 hosts
    # x 8 procs on 2 loaded cores, an agent stopped every proc mid-spawn ("hub silent for
    # 2.0 s") and the spawn failed. From the start it now counts only what the hub ran.
    from monarch_nb.host.agent import HostAgent
    from monarch_nb.wire import frames

    frames.register_key("starved-agent", b"k" * 32)
    runnable = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a hub that never sends
    try:
        told = HostAgent("starved-agent", str(tmp_path), "tcp://127.0.0.1:1", "h0", 2.0, hub_pid=runnable.pid)
        untold = HostAgent("starved-agent", str(tmp_path), "tcp://127.0.0.1:1", "h1", 2.0)
        try:
            # 60 s of silence of a process that ran for less: the rest it waited for a CPU.
            assert told.hub_cpu.counted(60.0) < 2.0
            assert untold.hub_cpu.counted(60.0) == 60.0  # a hub elsewhere: all of it counts
        finally:
            told.net.close()
            untold.net.close()
    finally:
        runnable.kill()
        runnable.wait()
