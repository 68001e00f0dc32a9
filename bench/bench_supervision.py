"""Supervision benchmark: failure detection and recovery, as seen by the client.

    .venv/bin/python bench/bench_supervision.py [--quick]

1. SIGKILL of a proc -> SupervisionError: each repetition spawns 2 procs with one
   actor each, starts a call that keeps both busy for a minute, SIGKILLs one proc and
   times until ``get()`` raises (target: 50 ms; Monarch 0.7 takes ~10 s here, Ray
   14 ms, ipyparallel 17 ms). Baseline: the median round trip of a call to the same 2
   actors, measured in the same run.
2. SIGKILL of a host agent (a whole host lost) -> SupervisionError, on a 2-host
   cluster (bound: the hub's 3 s heartbeat timeout).
3. ``restart_failed()`` of 1 of 8 procs (new proc, actor re-created with its
   constructor arguments) and the first call after it, against spawning a fresh
   8-proc mesh and its actors (what a user would do without it), same run.
4. SIGKILL of the hub -> SupervisionError of a call waiting on its actors, on an
   ephemeral cluster whose host agents stop every proc ``grace_s`` = 2 s after the hub
   goes (bound: the grace, plus 1 s margin, plus the client's 1 s heartbeat; before,
   the call waited until its own timeout).

Runs in an isolated MONARCH_NB_HOME; exit status 1 if a process is left behind.
"""

from __future__ import annotations

from tidy import isolated_home, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from monarch_nb.actor import SupervisionError, this_host  # noqa: E402
from monarch_nb.client import cluster as cluster_mod  # noqa: E402
from monarch_nb.client.runtime import runtime  # noqa: E402

from bench_echo import Busy  # noqa: E402


def _host_loss(reps: int) -> list[float]:
    """Seconds from SIGKILL of a host agent to SupervisionError, on a 2-host cluster."""
    times = []
    cluster = cluster_mod.Cluster.start_ephemeral(hosts=2)
    try:
        for i in range(reps):
            procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 1}, name=f"twohosts{i}")
            mesh = procs.spawn(f"twohosts{i}", Busy)
            pending = mesh.wait.call(60)
            agent = cluster.info()["hosts"][1]["pid"]
            t = time.perf_counter()
            os.kill(agent, signal.SIGKILL)
            try:
                pending.get(timeout=60)
            except SupervisionError:
                times.append(time.perf_counter() - t)
            procs.stop()
            cluster.stop()
            if i + 1 < reps:
                cluster = cluster_mod.Cluster.start_ephemeral(hosts=2)
    finally:
        if not cluster._stopped:
            cluster.stop()
    return times


def _hub_loss(reps: int, grace_s: float) -> list[float]:
    """Seconds from SIGKILL of the hub to SupervisionError of a call waiting on its actors."""
    times = []
    for i in range(reps):
        cluster = cluster_mod.Cluster.start_ephemeral(grace_s=grace_s)
        try:
            procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 1}, name=f"hubless{i}")
            pending = procs.spawn(f"hubless{i}", Busy).wait.call(60)
            t = time.perf_counter()
            os.kill(cluster._hub_process.pid, signal.SIGKILL)
            try:
                pending.get(timeout=60)
            except SupervisionError:
                times.append(time.perf_counter() - t)
        finally:
            cluster.stop()
    return times


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    reps = 5 if args.quick else 20
    host = this_host()
    cluster = runtime().cluster
    detect, rtt = [], []
    try:
        for i in range(reps):
            procs = host.spawn_procs(per_host={"gpus": 2}, name=f"victims{i}")
            mesh = procs.spawn(f"busy{i}", Busy)
            pids = mesh.pid.call().get().values()
            for _ in range(20):
                t = time.perf_counter()
                mesh.pid.call().get()
                rtt.append(time.perf_counter() - t)
            pending = mesh.wait.call(60)
            t = time.perf_counter()
            os.kill(pids[1], signal.SIGKILL)
            try:
                pending.get(timeout=60)
            except SupervisionError:
                detect.append(time.perf_counter() - t)
            procs.stop()
        med, p99 = statistics.median(detect), max(detect)
        print(f"SIGKILLed proc -> SupervisionError at the client: median {med * 1e3:.1f} ms, max {p99 * 1e3:.1f} ms "
              f"(n={len(detect)}); call round trip to the same 2 actors {statistics.median(rtt) * 1e3:.2f} ms "
              f"(ratio {med / statistics.median(rtt):.1f}); target <= 50 ms: {'met' if med <= 0.05 else 'MISSED'}",
              flush=True)
        host_lost = _host_loss(2 if args.quick else 3)
        print(f"SIGKILLed host agent -> SupervisionError: median {statistics.median(host_lost):.2f} s "
              f"(n={len(host_lost)}; bound: the local allocator sees its agent exit within its 1 s poll; elsewhere the 3 s heartbeat timeout)", flush=True)
        hub_lost = _hub_loss(2 if args.quick else 5, grace_s=2.0)
        print(f"SIGKILLed hub -> SupervisionError of a waiting call: median {statistics.median(hub_lost):.2f} s, "
              f"max {max(hub_lost):.2f} s (n={len(hub_lost)}; the agents stop every proc 2 s after the hub goes; "
              "bound 4 s: grace + 1 s margin + the client's 1 s heartbeat)", flush=True)
        restart, fresh = [], []
        for i in range(3 if args.quick else 5):
            t = time.perf_counter()
            procs = host.spawn_procs(per_host={"gpus": 8}, name=f"eight{i}")
            mesh = procs.spawn(f"eight{i}", Busy)
            pids = mesh.pid.call().get().values()
            fresh.append(time.perf_counter() - t)
            os.kill(pids[3], signal.SIGKILL)
            try:
                mesh.pid.call().get(timeout=60)
            except SupervisionError:
                pass
            t = time.perf_counter()
            procs.restart_failed()
            mesh.pid.call().get()
            restart.append(time.perf_counter() - t)
            procs.stop()
        print(f"restart_failed() of 1 of 8 procs + first call: median {statistics.median(restart) * 1e3:.0f} ms; "
              f"spawning 8 fresh procs + actors + call: {statistics.median(fresh) * 1e3:.0f} ms "
              f"(ratio {statistics.median(restart) / statistics.median(fresh):.2f})", flush=True)
    finally:
        status = stop_and_check(cluster, _OWN_HOME)
    return status


if __name__ == "__main__":
    sys.exit(main())
