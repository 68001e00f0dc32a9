"""Replica groups with a Slurm job each (``ReplicaGroups(allocator=SlurmAllocator(...))``):
what losing one group's job costs, against restarting every group, on the local Slurm of
.ci/setup.d/30-slurm.sh (two emulated nodes on this machine).

    .venv/bin/python bench/bench_ft_slurm.py [--reps N]

Each repetition starts 2 replica groups of 1 proc, each in a 1-node job of its own,
steps them, then ``scancel``s group 1's job (a node lost, a job preempted) and steps on:

- detected: ``scancel`` -> the first step without group 1
- recovered: -> group 1 steps again, on a new job (the old one given back, a new one
  submitted, queued, its agent up, procs and actors started, ``on_join`` from group 0)
- healthy steps: the steps group 0 made meanwhile (it never waits for group 1)

Baseline, in the same run: the full restart the same fault costs without replica groups
on jobs of their own: every group's job given back and every group started again on new
jobs, then the weights loaded (from the controller). Exit status 1 if a process or a
job is left behind.
"""

from __future__ import annotations

from tidy import isolated_home

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from monarch_nb.actor import Actor, endpoint  # noqa: E402
from monarch_nb.allocators.slurm import SlurmAllocator  # noqa: E402
from monarch_nb.client.cluster import Cluster  # noqa: E402
from monarch_nb.ft import GroupState, ReplicaGroups  # noqa: E402

from tidy import stop_and_check  # noqa: E402


class Stepper(Actor):
    def __init__(self):
        self.steps = 0

    @endpoint
    def step(self) -> int:
        self.steps += 1
        return self.steps

    @endpoint
    def state(self) -> int:
        return self.steps

    @endpoint
    def load(self, steps: int) -> None:
        self.steps = steps


def copy_state(group, donor) -> None:
    if donor is not None:
        group.actors.load.call(donor.actors.slice(gpus=0).state.call_one().get()).get()


def groups(cluster: Cluster, name: str) -> ReplicaGroups:
    return ReplicaGroups(cluster.host_mesh(), name, Stepper, num_groups=2, per_group={"gpus": 1},
                         on_join=copy_state, allocator=SlurmAllocator(nodes=1, start_timeout=120))


def job_of(cluster: Cluster, group_index: int) -> str:
    allocations = cluster.info()["allocations"]
    return next(a["allocator"]["job_id"] for name, a in allocations.items() if f"_{group_index}_" in name)


def partial(cluster: Cluster, rep: int) -> dict:
    rg = groups(cluster, f"p{rep}")
    try:
        rg.call("step")
        victim = rg.groups[1]
        killed = time.perf_counter()
        subprocess.run(["scancel", job_of(cluster, 1)], check=True, timeout=30)
        while 1 in rg.call("step"):
            pass
        detected = time.perf_counter()
        healthy_steps = 0
        while victim.state is not GroupState.HEALTHY:
            healthy_steps += 1
            rg.call("step")
        recovered = time.perf_counter()
        return {"detected": detected - killed, "recovered": recovered - detected, "healthy_steps": healthy_steps}
    finally:
        rg.stop()


def full_restart(cluster: Cluster, rep: int) -> float:
    rg = groups(cluster, f"f{rep}")
    try:
        rg.call("step")
        steps = rg.groups[0].actors.slice(gpus=0).state.call_one().get()
        started = time.perf_counter()
        rg.stop()
        rg = groups(cluster, f"g{rep}")
        for g in rg.groups:
            g.actors.load.call(steps).get()
        rg.call("step")
        return time.perf_counter() - started
    finally:
        rg.stop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    cluster = Cluster.start("bench-ft-slurm", hosts=1)
    parts, full = [], []
    try:
        for rep in range(args.reps):  # interleaved, so both see the same machine
            parts.append(partial(cluster, rep))
            full.append(full_restart(cluster, rep))
    finally:
        code = stop_and_check(cluster, _OWN_HOME)
    med = {k: statistics.median(p[k] for p in parts) for k in parts[0]}
    full_s = statistics.median(full)
    print(f"2 replica groups, a 1-node Slurm job each; group 1's job cancelled; median of {args.reps}:")
    print(f"  detected (scancel -> first step without it)    {med['detected']:7.2f} s")
    print(f"  recovered on a new job (-> stepping again)     {med['recovered']:7.2f} s")
    print(f"  steps group 0 made meanwhile                   {med['healthy_steps']:7.0f}")
    total = med["detected"] + med["recovered"]
    print(f"  partial recovery, in all                       {total:7.2f} s")
    print(f"  full restart (every job anew), same run        {full_s:7.2f} s  "
          f"partial is {100 * (1 - total / full_s):.0f}% faster")
    squeue = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, timeout=30).stdout
    left = [line for line in squeue.splitlines() if "bench-ft-slurm" in line]
    if left:
        print(f"jobs left behind: {left}")
        return 1
    return code


if __name__ == "__main__":
    raise SystemExit(main())
