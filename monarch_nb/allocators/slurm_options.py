"""``--slurm`` and its options, shared by ``monarch-nb cluster start`` and
``%monarch start``: ``--slurm --nodes 2 --partition debug --time 1:00:00 ...``;
``--dry-run`` prints the batch script instead of submitting it. Options not given come
from ``$MONARCH_NB_HOME/config.toml`` (``slurm_config``)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--slurm`` and the :class:`~.slurm.SlurmAllocator` options to ``parser``."""
    group = parser.add_argument_group("Slurm (hosts from a batch job; one host per node)")
    group.add_argument("--slurm", action="store_true", help="get hosts from Slurm instead of this machine")
    group.add_argument("--nodes", type=int, default=None, help="nodes, one host each (default 1)")
    group.add_argument("--partition", default=None)
    group.add_argument("--time", default=None, help="time limit, as sbatch --time (e.g. 1:00:00)")
    group.add_argument("--mem", default=None, help="memory per node, as sbatch --mem (e.g. 64G)")
    group.add_argument("--gpus-per-node", type=int, default=None)
    group.add_argument("--cpus-per-task", type=int, default=None)
    group.add_argument("--account", default=None)
    group.add_argument("--qos", default=None)
    group.add_argument("--sbatch-arg", action="append", default=[], metavar="OPTION",
                       help="another sbatch option, repeatable: --sbatch-arg=--exclusive")
    group.add_argument("--setup", action="append", default=[], metavar="LINE",
                       help="a shell line the job runs before the agents, repeatable: "
                            "--setup 'module load cuda'")
    group.add_argument("--start-timeout", type=float, default=None,
                       help="seconds to wait for the job to run and its agents to report (default 300)")
    group.add_argument("--bind", default=None, help="the hub's interface (default: the one routing to the nodes)")
    group.add_argument("--dry-run", action="store_true", help="print the batch script; submit nothing")


_SLURM_ONLY = ("nodes", "partition", "time", "mem", "gpus_per_node", "cpus_per_task", "account", "qos")


def allocator_from(args: argparse.Namespace):
    """The :class:`~.slurm.SlurmAllocator` the options ask for, or ``None`` without
    ``--slurm``. Raises ``ValueError`` for Slurm options without ``--slurm``, or
    ``--hosts`` with it."""
    if not args.slurm:
        given = [f"--{k.replace('_', '-')}" for k in _SLURM_ONLY if getattr(args, k) is not None]
        given += [f"--{k.replace('_', '-')}" for k in ("sbatch_arg", "setup", "dry_run") if getattr(args, k)]
        if given:
            raise ValueError(f"{', '.join(given)} only apply to Slurm clusters: add --slurm")
        return None
    if getattr(args, "hosts", None) is not None:
        raise ValueError("--hosts is for local clusters; on Slurm give --nodes")
    from .slurm import SlurmAllocator

    return SlurmAllocator(nodes=1 if args.nodes is None else args.nodes, partition=args.partition, time=args.time,
                          mem=args.mem, gpus_per_node=args.gpus_per_node, cpus_per_task=args.cpus_per_task,
                          account=args.account, qos=args.qos, setup=args.setup or None,
                          extra_sbatch_args=args.sbatch_arg or None, start_timeout=args.start_timeout,
                          bind=args.bind)


def describe(info: dict) -> str:
    """``"Slurm job 12 (2 node(s))"`` for a cluster's ``cluster.json``; ``""`` if not on Slurm."""
    spec = info.get("allocator") or {}
    if spec.get("kind") != "slurm":
        return ""
    return f"Slurm job {spec.get('job_id')} ({spec.get('nodes')} node(s))"
