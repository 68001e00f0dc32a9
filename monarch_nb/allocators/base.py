"""The allocator protocol: what the hub asks of anything that gets hosts.

An allocator acquires hosts, starts one host agent on each (the agent dials the hub
and signs every message with the cluster key read from the cluster directory),
reports them in ``hosts``-dimension order, watches the allocation while the cluster
runs and releases the hosts at the end. The hub creates one from a *spec*, a small
JSON-able dict (``{"kind": "slurm", "nodes": 2, ...}``) that also goes into the
state file, so a recovering hub re-adopts the same allocation (e.g. the same Slurm
job). Implementations: :mod:`.local` (subprocesses on this machine), :mod:`.slurm`
(a batch job whose ``srun`` starts the agents), :mod:`.command` (agents started
through a command prefix such as ``ip netns exec NS``), :mod:`.workers` (workers that
were waiting at known addresses become the agents).

Methods may block (they run commands like ``sbatch``); the hub calls the slow ones in
a worker thread.
"""

from __future__ import annotations

from typing import Protocol


class Allocator(Protocol):
    kind: str
    start_timeout_s: float  # how long the hub waits for every agent to report (queue wait included)

    def spec(self) -> dict:
        """What recreates this allocator (and its live allocation, once started)."""

    def bind_address(self) -> str | None:
        """The interface the hub and this machine's agents bind on (an IP), or ``None``
        for ``MONARCH_NB_BIND``/loopback."""

    def start(self, hub_address: str, hosts: int) -> list[str]:
        """Acquire ``hosts`` hosts and start a host agent on each; returns their host ids
        in ``hosts``-dimension order (each agent reports ``agent_ready`` with its id)."""

    def cancel_start(self) -> None:
        """Called from another thread while :meth:`start` runs: return soon, starting
        no more agents (the hub gave the start up; :meth:`stop` ends what was started)."""

    host_ids: list[str]  # the hosts of its allocation, in ``hosts``-dimension order, once started

    def adopt(self, pids: dict[str, int]) -> None:
        """Take charge of live host agents (host id -> pid) a previous hub started."""

    def check(self) -> dict[str, str]:
        """Hosts whose allocation has ended (host id -> why, e.g. "Slurm job 12 was
        CANCELLED"); ``{}`` while all is well. Called about once a second."""

    def waiting_for(self) -> str:
        """Why agents have not reported yet (e.g. the job's state and reason), for the
        error raised when ``start_timeout_s`` passes; ``""`` if nothing to add."""

    def stop(self, timeout: float) -> None:
        """Release every host: wait up to ``timeout`` seconds for agents told to shut
        down, then end what is left (kill, or cancel the job) and wait for it."""


# The kinds that can give a cluster more hosts once it runs (``Cluster.allocate``).
ADDED_KINDS = ("local", "slurm", "command")


def create(spec: dict | None, cluster_dir: str, grace_s: float, allocation: str = "") -> Allocator:
    """The allocator ``spec`` describes (``None``: local). ``allocation``: the name of
    an allocation added to a running cluster (``Cluster.allocate``; ``""``: the
    cluster's own): its host ids are ``{allocation}-host{i}`` and a Slurm job of its own
    is named after it. Raises ``ValueError`` for an unknown kind, or one that cannot be
    added (not in ``ADDED_KINDS``)."""
    spec = dict(spec or {"kind": "local"})
    kind = spec.pop("kind", "local")
    if allocation and kind not in ADDED_KINDS:
        raise ValueError(f"an allocator of kind {kind!r} cannot add hosts to a running cluster; "
                         f"use one of {', '.join(ADDED_KINDS)}")
    if kind == "local":
        from .local import LocalAllocator
        return LocalAllocator(cluster_dir, grace_s, allocation)
    if kind == "slurm":
        from .slurm import SlurmAllocator
        return SlurmAllocator.from_spec(spec, cluster_dir, grace_s, allocation)
    if kind == "command":
        from .command import CommandAllocator
        return CommandAllocator.from_spec(spec, cluster_dir, grace_s, allocation)
    if kind == "workers":
        from .workers import WorkersAllocator
        return WorkersAllocator.from_spec(spec, cluster_dir, grace_s)
    raise ValueError(f"unknown allocator kind {kind!r}: use 'local', 'slurm', 'command' or 'workers'")


def release_leftovers(cluster_dir: str, spec: dict | None) -> None:
    """End what an allocation of a cluster whose hub is gone may still hold outside
    this machine (a Slurm job); local agents are found and stopped by the caller."""
    if spec and spec.get("kind") == "slurm":
        from .slurm import release_leftovers as release_slurm
        release_slurm(spec, cluster_dir)
