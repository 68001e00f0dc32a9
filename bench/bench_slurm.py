"""Slurm benchmark: from ``Cluster.start(allocator=SlurmAllocator(nodes=2))`` to the
first endpoint call's result, on the local Slurm of .ci/setup.d/30-slurm.sh.

    .venv/bin/python bench/bench_slurm.py [--quick]

Each repetition starts a 2-node Slurm cluster, spawns one proc per host with one actor
each, calls it, and stops the cluster (the job must end). The start is split at points
taken on this machine (the emulated nodes are this machine, so one clock):

- hub: client calls ``Cluster.start`` -> the hub calls ``sbatch``
- queue: ``sbatch`` -> the batch script runs (submission, scheduling, job launch)
- step: the batch script runs -> the last host agent process exists (``srun``)
- agents: -> every agent has dialed the hub and ``Cluster.start`` returned
- first call: spawn procs + actors, and the call (the same as local)

Baseline, interleaved in the same run: a local 2-host cluster (``Cluster.start(hosts=2)``)
doing the same. Ratios are Slurm over local. Runs in an isolated MONARCH_NB_HOME; exit
status 1 if a process or a job is left behind.
"""

from __future__ import annotations

from tidy import isolated_home

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import psutil  # noqa: E402

from monarch_nb.actor import Actor, endpoint  # noqa: E402
from monarch_nb.allocators import slurm_parse  # noqa: E402
from monarch_nb.allocators.slurm import SlurmAllocator  # noqa: E402
from monarch_nb.client.cluster import Cluster  # noqa: E402


class Ping(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def first_call(cluster: Cluster, t0: float) -> dict:
    t = time.time()
    mesh = cluster.host_mesh().spawn_procs(per_host={"gpus": 1}).spawn("ping", Ping)
    assert mesh.ping.call().get(timeout=120).values() == [1, 1]
    end = time.time()
    return {"first_call": end - t, "total": end - t0}


def run_local(i: int) -> dict:
    t0 = time.time()
    cluster = Cluster.start(f"bench-local-{i}", hosts=2)
    parts = {"start": time.time() - t0, **first_call(cluster, t0)}
    t = time.time()
    cluster.stop()
    parts["stop"] = time.time() - t
    return parts


def run_slurm(i: int) -> tuple[dict, str]:
    t0 = time.time()
    cluster = Cluster.start(f"bench-slurm-{i}", allocator=SlurmAllocator(nodes=2, start_timeout=120))
    started = time.time()
    spec = cluster.info()["allocator"]
    job_id = spec["job_id"]
    output = (cluster.path / f"slurm-{job_id}.out").read_text()
    batch_start = float(re.search(r"running on \S+ at ([\d.]+)", output).group(1))
    agents = max(started_at(h["pid"]) for h in cluster.info()["hosts"])
    parts = {"hub": spec["submitted"] - t0, "queue": batch_start - spec["submitted"],
             "step": agents - batch_start, "agents": started - agents, "start": started - t0,
             **first_call(cluster, t0)}
    t = time.time()
    cluster.stop()
    parts["stop"] = time.time() - t
    return parts, job_id


def started_at(pid: int) -> float:
    """When process ``pid`` started, in epoch seconds, to a clock tick (psutil's
    create_time rests on a boot time rounded to the second)."""
    with open(f"/proc/{pid}/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))


def job_left(job_id: str) -> bool:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
    records = slurm_parse.parse_scontrol(out.stdout) if out.returncode == 0 else []
    return bool(records) and slurm_parse.job_state(records[0])[0] not in slurm_parse.FINAL_STATES


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    reps = 2 if args.quick else 6
    local, slurm, jobs = [], [], []
    for i in range(reps):  # interleaved, so both see the same machine
        local.append(run_local(i))
        parts, job_id = run_slurm(i)
        slurm.append(parts)
        jobs.append(job_id)
    med = {k: statistics.median(r[k] for r in slurm) for k in slurm[0]}
    base = {k: statistics.median(r[k] for r in local) for k in local[0]}
    print(f"Slurm cluster (2 emulated nodes) vs local (2 host agents), median of {reps}, seconds:")
    print(f"  {'':42} {'slurm':>7} {'local':>7} {'ratio':>6}")
    for key, label in (("hub", "  hub starts, calls sbatch"), ("queue", "  queue: sbatch -> batch script"),
                       ("step", "  srun: -> host agent processes"), ("agents", "  agents dial the hub, client attached"),
                       ("start", "Cluster.start()"), ("first_call", "spawn procs + actors + first call"),
                       ("total", "Cluster.start() -> first call result"), ("stop", "cluster.stop() (job ended)")):
        local_value = base.get(key)
        ratio = f"{med[key] / local_value:6.1f}" if local_value else ""
        shown = f"{local_value:7.3f}" if local_value is not None else ""
        print(f"  {label:42} {med[key]:7.3f} {shown:>7} {ratio:>6}")
    left = [j for j in jobs if job_left(j)]
    leftovers = [p.pid for p in psutil.process_iter(["cmdline"])
                 if "bench-" in " ".join(p.info["cmdline"] or []) and "monarch_nb" in " ".join(p.info["cmdline"] or [])]
    if _OWN_HOME:
        shutil.rmtree(_OWN_HOME, ignore_errors=True)
    if left or leftovers:
        print(f"left behind: jobs {left}, processes {leftovers}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
