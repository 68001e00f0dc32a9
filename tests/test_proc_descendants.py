"""Processes an actor starts end with its proc: after ``procs.stop()``, after the proc
is killed (SIGKILL), and after ``cluster.stop()``, including a child that ignores
SIGTERM, a shell's own child and one that left the proc's session."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from conftest import pids_alive, wait_until

from monarch_nb.actor import Actor, endpoint

BOUND_S = 30.0  # generous: on the old code they run for 600 s


class Spawner(Actor):
    def __init__(self):
        self.children: list = []

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def start_children(self) -> list[int]:
        """pids of: a sleep, a child ignoring SIGTERM, a shell and its own child, and a
        sleep in a session of its own."""
        sleep = subprocess.Popen(["sleep", "600"])
        stubborn = subprocess.Popen(
            [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                   "print('ready', flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
        stubborn.stdout.readline()  # its handler is in place
        shell = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!; wait"], stdout=subprocess.PIPE)
        shells_child = int(shell.stdout.readline())
        escaped = subprocess.Popen(["sleep", "600"], start_new_session=True)
        self.children = [sleep, stubborn, shell, escaped]
        return [sleep.pid, stubborn.pid, shell.pid, shells_child, escaped.pid]


def _start_children(procs, name: str) -> tuple[int, list[int]]:
    spawner = procs.spawn(name, Spawner)
    pids = spawner.start_children.call_one().get(timeout=BOUND_S)
    assert pids_alive(pids) == pids
    return spawner.pid.call_one().get(timeout=BOUND_S), pids


def test_what_an_actor_started_ends_with_procs_stop(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="parents_stop")
    _, pids = _start_children(procs, "spawner_stop")
    procs.stop()
    assert wait_until(lambda: not pids_alive(pids), BOUND_S), f"left running: {pids_alive(pids)}"


def test_what_an_actor_started_ends_when_its_proc_is_killed(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="parents_kill")
    try:
        proc_pid, pids = _start_children(procs, "spawner_kill")
        os.kill(proc_pid, signal.SIGKILL)
        assert wait_until(lambda: not pids_alive(pids), BOUND_S), f"left running: {pids_alive(pids)}"
    finally:
        procs.stop()


def test_what_an_actor_started_ends_with_cluster_stop():
    from monarch_nb.client.cluster import Cluster

    cluster = Cluster.start_ephemeral()
    try:
        procs = cluster.this_host().spawn_procs(per_host={"gpus": 1}, name="parents_cluster")
        _, pids = _start_children(procs, "spawner_cluster")
    finally:
        cluster.stop()
    assert wait_until(lambda: not pids_alive(pids), BOUND_S), f"left running: {pids_alive(pids)}"
