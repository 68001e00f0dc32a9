"""Starting a wide ephemeral cluster on a busy machine: does every host survive its start?

    .venv/bin/python bench/bench_wide_start.py [--hosts 32] [--per-host 8] [--runs 3]

Each run starts an ephemeral cluster of ``--hosts`` local host agents (an ephemeral
cluster's agents stop every proc after 2 s of hub silence), spawns ``--per-host`` procs
on each, and stops it. Starting 32 agents at once loads 2 cores far past their count
(load averages of 20-40): the hub's silence there is its threads waiting for a CPU, which
its agents must excuse (``monarch_nb.starvation``). Per run it prints the start and spawn
times and the hosts lost (agents that said "stopping every proc"); at the end, how many
runs lost a host. Each run in an isolated MONARCH_NB_HOME; exit status 1 if a process
is left behind.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

RUN = r"""
import sys, time
from tidy import stop_and_check
from monarch_nb.client.cluster import Cluster
hosts, per_host = int(sys.argv[1]), int(sys.argv[2])
started = time.perf_counter()
cluster = Cluster.start_ephemeral(hosts=hosts)
up = time.perf_counter() - started
spawned = "-"
try:
    procs = cluster.host_mesh().spawn_procs(per_host={"gpus": per_host}, name="wide")
    spawned = f"{time.perf_counter() - started - up:.1f} s"
    procs.stop().get()
except Exception as e:  # a host lost while its procs started: what this bench counts
    spawned = f"failed ({type(e).__name__}: {str(e)[:120]})"
print(f"up in {up:.1f} s, {hosts * per_host} procs spawned: {spawned}", flush=True)
sys.exit(stop_and_check(cluster, None))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--per-host", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"wide start: {args.hosts} local hosts x {args.per_host} procs, {args.runs} runs, {os.cpu_count()} CPUs",
          flush=True)
    lost_runs, status = 0, 0
    for run in range(args.runs):
        home = tempfile.mkdtemp(prefix="monarch_nb_bench_")
        out = subprocess.run([sys.executable, "-c", RUN, str(args.hosts), str(args.per_host)], capture_output=True,
                             text=True, timeout=600, cwd=os.path.dirname(os.path.abspath(__file__)),
                             env={**os.environ, "MONARCH_NB_HOME": home})
        lost = out.stderr.count("stopping every proc")
        lost_runs += bool(lost) or "failed" in out.stdout
        status |= out.returncode
        print(f"  run {run + 1}: {out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-300:]}; "
              f"hosts whose agent stopped every proc: {lost}", flush=True)
    print(f"runs that lost a host: {lost_runs} of {args.runs}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
