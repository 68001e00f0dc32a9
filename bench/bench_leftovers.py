"""Leftovers benchmark: what is still running after a stop.

    .venv/bin/python bench/bench_leftovers.py [--quick]

Each actor of a 4-proc mesh starts 5 processes (a sleep, a child ignoring SIGTERM, a
shell and its own child, a sleep in a session of its own). Printed: how many of those
20 are still running after each way a proc ends (``procs.stop()``, SIGKILL of the
procs, ``cluster.stop()``; target 0), and how long ``procs.stop()`` takes with them,
against the same stop of a mesh whose actors started nothing (same run): the price is
the grace a child ignoring SIGTERM gets before its SIGKILL.

Runs in an isolated MONARCH_NB_HOME; exit status 1 if anything is left behind.
"""

from __future__ import annotations

from tidy import isolated_home, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import psutil  # noqa: E402

from monarch_nb.actor import Actor, endpoint  # noqa: E402
from monarch_nb.client.cluster import Cluster  # noqa: E402

PROCS = 4
SETTLE_S = 10.0  # how long a scenario waits for the leftovers to end before counting them


class Spawner(Actor):
    def __init__(self):
        self.children: list = []

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def start_children(self) -> list[int]:
        sleep = subprocess.Popen(["sleep", "600"])
        stubborn = subprocess.Popen(
            [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                   "print('ready', flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
        stubborn.stdout.readline()
        shell = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!; wait"], stdout=subprocess.PIPE)
        shells_child = int(shell.stdout.readline())
        escaped = subprocess.Popen(["sleep", "600"], start_new_session=True)
        self.children = [sleep, stubborn, shell, escaped]
        return [sleep.pid, stubborn.pid, shell.pid, shells_child, escaped.pid]

    @endpoint
    def nothing(self) -> None:
        return None


def alive(pids) -> list[int]:
    left = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            pass
    return left


def settle(pids) -> list[int]:
    deadline = time.monotonic() + SETTLE_S
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = alive(pids)
    for pid in left:  # the benchmark cleans up after the code it measures
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def start(host, name: str):
    procs = host.spawn_procs(per_host={"gpus": PROCS}, name=name)
    spawners = procs.spawn(name, Spawner)
    pids = [p for one in spawners.start_children.call().get(timeout=60).values() for p in one]
    return procs, spawners, pids


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    reps = 2 if parser.parse_args().quick else 5
    cluster = Cluster.start_ephemeral()
    host = cluster.this_host()
    status = 0
    try:
        with_children, without = [], []
        for i in range(reps):
            procs, _, pids = start(host, f"stop{i}")
            t0 = time.perf_counter()
            procs.stop()
            with_children.append(time.perf_counter() - t0)
            left = settle(pids)
            print(f"procs.stop():        {len(left)} of {len(pids)} left running", flush=True)
            status |= bool(left)
            idle = host.spawn_procs(per_host={"gpus": PROCS}, name=f"idle{i}")
            idle.spawn(f"idle{i}", Spawner).nothing.call().get(timeout=60)
            t0 = time.perf_counter()
            idle.stop()
            without.append(time.perf_counter() - t0)
        print(f"procs.stop() of {PROCS} procs: {statistics.median(with_children) * 1000:.0f} ms with 5 children "
              f"each (one ignoring SIGTERM), {statistics.median(without) * 1000:.0f} ms without (median of {reps})")

        procs, spawners, pids = start(host, "killed")
        for pid in spawners.pid.call().get(timeout=60).values():
            os.kill(pid, signal.SIGKILL)
        left = settle(pids)
        print(f"SIGKILL of the procs: {len(left)} of {len(pids)} left running", flush=True)
        status |= bool(left)
        procs.stop()

        _, _, pids = start(host, "cluster")
    finally:
        status |= stop_and_check(cluster, _OWN_HOME)
    left = settle(pids)
    print(f"cluster.stop():      {len(left)} of {len(pids)} left running", flush=True)
    return int(status or bool(left))


if __name__ == "__main__":
    sys.exit(main())
