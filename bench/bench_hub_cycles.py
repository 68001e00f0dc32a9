"""Spawn / call / stop cycles: do the hub, host agent and client stay flat?

Each cycle spawns a proc mesh of ``--procs`` procs, spawns an actor on each, calls it
once and stops the mesh. Prints file descriptors, RSS and idle CPU (percent of one
core over ``--idle`` seconds with nothing running) of the hub, the host agent and
this client, after the first cycle and after the last, from the same run.

    .venv/bin/python bench/bench_hub_cycles.py --cycles 1000 --procs 8
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import psutil

os.environ.setdefault("MONARCH_NB_HOME", tempfile.mkdtemp(prefix="monarch-nb-bench-"))

from monarch_nb.actor import Actor, endpoint  # noqa: E402
from monarch_nb.client.cluster import Cluster  # noqa: E402


class Echo(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def usage(processes: dict[str, psutil.Process], idle_s: float) -> dict[str, tuple[int, float, float]]:
    """name -> (fds, RSS MiB, idle CPU %) measured over ``idle_s`` seconds of quiet."""
    before = {n: p.cpu_times() for n, p in processes.items()}
    time.sleep(idle_s)
    out = {}
    for name, p in processes.items():
        after = p.cpu_times()
        cpu = (after.user + after.system - before[name].user - before[name].system) / idle_s * 100
        out[name] = (p.num_fds(), p.memory_info().rss / 2**20, cpu)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of quiet to measure idle CPU over")
    args = parser.parse_args()
    cluster = Cluster.start_ephemeral()
    try:
        info = cluster.info()
        processes = {"hub": psutil.Process(info["hub_pid"]), "host agent": psutil.Process(info["hosts"][0]["pid"]),
                     "client": psutil.Process()}
        host = cluster.host_mesh()

        def cycle(i: int) -> None:
            procs = host.spawn_procs(per_host={"gpus": args.procs}, name=f"cycle{i % 4}")
            procs.spawn("echo", Echo).pid.call().get(timeout=120)
            procs.stop()

        cycle(0)
        first = usage(processes, args.idle)
        t0 = time.monotonic()
        for i in range(1, args.cycles):
            cycle(i)
            if i % 100 == 0:
                print(f"  cycle {i}: hub {processes['hub'].num_fds()} fds, "
                      f"{processes['hub'].memory_info().rss / 2**20:.0f} MiB", flush=True)
        elapsed = time.monotonic() - t0
        last = usage(processes, args.idle)
        stats = cluster.info()["hub_stats"]
    finally:
        cluster.stop()
    print(f"\n{args.cycles} cycles of {args.procs} procs (spawn, call, stop) in {elapsed:.0f} s "
          f"({elapsed / max(1, args.cycles - 1) * 1000:.0f} ms a cycle); hub sockets open at the end: "
          f"{stats['sockets']}")
    print(f"{'':12} {'fds':>13} {'RSS MiB':>15} {'idle CPU %':>15}")
    for name in processes:
        (f0, r0, c0), (f1, r1, c1) = first[name], last[name]
        print(f"{name:12} {f0:>5} -> {f1:<5} {r0:>6.1f} -> {r1:<6.1f} {c0:>6.2f} -> {c1:<6.2f}")


if __name__ == "__main__":
    main()
