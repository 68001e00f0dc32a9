"""Partial recovery of replica groups against a full restart, same run (issue 27).

    .venv/bin/python bench/bench_ft.py [--groups 3] [--per-group 2] [--backend gloo] [--reps 3]

``--groups`` replica groups (monarch_nb.ft.ReplicaGroups) of ``--per-group`` procs each
train a small torch model (one DDP-free step: forward, backward, SGD on 4 KiB of
parameters, an all-reduce of the gradients inside the group with ``--backend``). Each
repetition SIGKILLs one rank of group 1 (``inject_fault``) and measures:

  detected      from the kill to the first step that runs without group 1 (s)
  recovered     from that to group 1 stepping again, with a healthy group's weights (s)
  healthy steps steps the other groups made meanwhile, and steps they lost (always 0:
                a step that fails is only the failed group's)
  full restart  the same fault handled as a job without replica groups must: stop every
                group, start them all again, load the weights (s, from the same
                detection)

Prints medians; "partial vs full" is the recovery time saved. Set
``MONARCH_NB_PROC_PRELOAD=torch,torch.distributed`` to have procs forked with torch
imported (both recoveries start procs). On 2 loaded cores, 3 groups x 2 procs, gloo:
detected after ~0.1 s; without the preload group 1 stepped again 8.9 s after detection
against 16.9 s for a full restart (47% less), with it 5.7 s against 6.5 s (12%): the rest
is ``init_process_group`` (~1.4 s here) and the healthy groups' steps sharing the cores
with the recovery. Healthy groups lost 0 steps.

``--spare`` (``ReplicaGroups(spare=True)``): group 1 is replaced on warm procs that have
imported torch (and torch._dynamo, which the first optimizer imports); the line "of
which" says where the recovery went. 2 cores at load ~3, no preload, run after run: at
5e1a187 group 1 stepped again 9.21 s after detection against 7.77 s for a full restart;
with ``--spare`` 1.69 s against 8.09 s (79% less: teardown 0.88 s, constructors 0.73 s).
Runs in an isolated
MONARCH_NB_HOME; exit status 1 if a process is left behind.
"""

from __future__ import annotations

from tidy import isolated_home, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import monarch_nb  # noqa: E402
from monarch_nb.actor import Actor, endpoint  # noqa: E402
from monarch_nb.ft import GroupState, ReplicaGroups, inject_fault  # noqa: E402


class Trainer(Actor):
    def __init__(self, backend: str | None):
        import torch
        torch.manual_seed(0)
        self.model = torch.nn.Linear(32, 32)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.steps = 0
        if backend is not None:
            import torch.distributed as dist
            dist.init_process_group(backend)

    @endpoint
    def step(self) -> int:
        import torch
        import torch.distributed as dist
        loss = self.model(torch.randn(16, 32)).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        if dist.is_initialized():
            for p in self.model.parameters():
                dist.all_reduce(p.grad)
        self.opt.step()
        self.steps += 1
        return self.steps

    @endpoint
    def weights(self) -> dict:
        return {"state": self.model.state_dict(), "steps": self.steps}

    @endpoint
    def load(self, weights: dict) -> None:
        self.model.load_state_dict(weights["state"])
        self.steps = weights["steps"]


def copy_weights(group, donor) -> None:
    if donor is not None:
        group.actors.load.call(donor.actors.slice(gpus=0).weights.call_one().get()).get()


def partial(rg: ReplicaGroups) -> dict:
    victim, others = rg.groups[1], {g.index for g in rg.groups} - {1}
    for _ in range(3):
        rg.call("step")
    lost = 0  # steps a healthy group did not make

    def step() -> set:
        nonlocal lost
        ran = set(rg.call("step"))
        lost += len(others - ran)
        return ran

    killed = time.perf_counter()
    inject_fault(victim.procs, "kill", ranks=[0])
    while 1 in step():
        pass
    detected = time.perf_counter()
    healthy_steps = 0
    while victim.state is not GroupState.HEALTHY:
        healthy_steps += 1
        step()
    recovered = time.perf_counter()
    phases = {f"{k}_s": v for k, v in victim.recovery_phases.items()}
    return {"detected_s": detected - killed, "recovered_s": recovered - detected, "healthy_steps": healthy_steps,
            "lost": lost, **phases}


def full_restart(cluster, groups: int, per_group: int, backend: str | None) -> float:
    """Stop every group and start them all again, then load the weights: what a job
    without replica groups does for the same fault (the weights from the controller)."""
    rg = ReplicaGroups(cluster.host_mesh(), "full", Trainer, backend, num_groups=groups,
                       per_group={"gpus": per_group}, backend=backend)
    try:
        rg.call("step")
        weights = rg.groups[0].actors.slice(gpus=0).weights.call_one().get()
        started = time.perf_counter()
        rg.stop()
        rg = ReplicaGroups(cluster.host_mesh(), "full", Trainer, backend, num_groups=groups,
                           per_group={"gpus": per_group}, backend=backend)
        for g in rg.groups:
            g.actors.load.call(weights).get()
        rg.call("step")
        return time.perf_counter() - started
    finally:
        rg.stop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--per-group", type=int, default=2)
    parser.add_argument("--backend", default="gloo", help="'none': no torch.distributed in the groups")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--spare", action="store_true", help="ReplicaGroups(spare=True): replace on warm procs")
    args = parser.parse_args()
    backend = None if args.backend == "none" else args.backend
    cluster = monarch_nb.Cluster.start_ephemeral()
    rows, fulls = [], []
    try:
        rg = ReplicaGroups(cluster.host_mesh(), "ft", Trainer, backend, num_groups=args.groups,
                           per_group={"gpus": args.per_group}, backend=backend, max_restarts=args.reps,
                           on_join=copy_weights, spare=args.spare)
        try:
            for _ in range(args.reps):
                rows.append(partial(rg))
                if rg.spare is not None:  # its refill would share the cores with the full restart
                    rg.spare.wait_ready()
                fulls.append(full_restart(cluster, args.groups, args.per_group, backend))
        finally:
            rg.stop()
    finally:
        left = stop_and_check(cluster, _OWN_HOME)
    med = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in rows[0]}
    full = statistics.median(fulls)
    print(f"{args.groups} groups x {args.per_group} procs, backend {backend}, {args.reps} faults (SIGKILL of one rank)"
          f"{', warm spare' if args.spare else ''}")
    print(f"  detected after     {med['detected_s'] * 1e3:8.0f} ms")
    print(f"  group 1 recovered  {med['recovered_s']:8.2f} s after detection "
          f"(healthy groups made {med['healthy_steps']:.0f} steps meanwhile, lost {med['lost']:.0f})")
    phases = [k for k in ("teardown_s", "procs_s", "torch_distributed_s", "actors_s", "join_s") if k in med]
    if phases:  # where the recovery went (ReplicaGroup.recovery_phases); the rest: waiting to be admitted
        print("    of which          " + ", ".join(f"{k[:-2]} {med[k]:.2f} s" for k in phases))
    print(f"  full restart       {full:8.2f} s after detection")
    print(f"  partial vs full    {1 - med['recovered_s'] / full:8.0%} less time to recover")
    return left


if __name__ == "__main__":
    sys.exit(main())
