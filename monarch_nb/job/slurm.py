"""``SlurmJob``: hosts from one Slurm batch job, through :class:`~monarch_nb.allocators.slurm.SlurmAllocator`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..allocators.slurm import SlurmAllocator
from .cluster_job import ClusterJob, check_meshes


class SlurmJob(ClusterJob):
    """One batch job for all meshes, one host per node: ``SlurmJob({"trainers": 4},
    partition="debug", gpus_per_node=8)``. Nodes go to the meshes in the job's node
    list order. ``time_limit``, ``partition``, ``gpus_per_node``, ``cpus_per_task``,
    ``mem``, ``account``, ``qos``, ``exclusive`` and ``slurm_args`` (extra ``sbatch``
    options) are as in ``sbatch``; ``job_start_timeout`` is the seconds to wait for
    the job to run (default: the allocator's 300 s). ``job_name`` names the batch job.

    Host agents run this client's Python (``sys.executable``) on every node, so the
    environment and the cluster directory must be on a filesystem the nodes share.
    ``monarch_port`` and ``log_dir`` are accepted and unused (agents pick their ports;
    their output is in the cluster directory). Raises ``NotImplementedError`` for
    ``ntasks_per_node`` other than 1, ``out_of_cluster``, ``attach_to`` or another
    ``python_exe``. ``cluster``: run as the retained cluster of that name (the batch
    job outlives this client until ``kill()``) instead of an ephemeral one."""

    def __init__(self, meshes: dict[str, int], python_exe: str = "python", slurm_args: Sequence[str] = (),
                 monarch_port: int = 22222, job_name: str = "monarch_job", ntasks_per_node: int = 1,
                 time_limit: str | None = None, partition: str | None = None, log_dir: str | None = None,
                 exclusive: bool = True, gpus_per_node: int | None = None, cpus_per_task: int | None = None,
                 mem: str | None = None, job_start_timeout: int | None = None, account: str | None = None,
                 qos: str | None = None, out_of_cluster: bool = False, attach_to: str | None = None, *,
                 cluster: str | None = None):
        unsupported = [what for what, given in (
            ("ntasks_per_node other than 1 (one host agent per node starts every proc of that node)",
             ntasks_per_node != 1),
            ("out_of_cluster / attach_to (the client must reach the nodes)", out_of_cluster or attach_to),
            (f"python_exe={python_exe!r} (agents run this client's {sys.executable})",
             python_exe not in ("python", sys.executable))) if given]
        if unsupported:
            raise NotImplementedError(f"monarch_nb's SlurmJob has no {'; no '.join(unsupported)}")
        super().__init__()
        self._meshes = check_meshes(meshes)
        self._cluster_name = cluster
        self._options = {"partition": partition, "time": time_limit, "mem": mem, "gpus_per_node": gpus_per_node,
                         "cpus_per_task": cpus_per_task, "account": account, "qos": qos, "job_name": job_name,
                         "extra_sbatch_args": [*(a for a in slurm_args if a.startswith("-")),
                                               *(["--exclusive"] if exclusive else [])]}
        if job_start_timeout is not None:
            self._options["start_timeout"] = float(job_start_timeout)

    def add_mesh(self, name: str, num_nodes: int) -> None:
        """Ask for one more mesh of ``num_nodes`` nodes (before the job is applied)."""
        self._meshes = check_meshes({**self._meshes, name: num_nodes})

    def _allocator(self) -> SlurmAllocator:
        return SlurmAllocator(nodes=self.hosts(), **self._options)

    def _same_allocation(self, spec: ClusterJob) -> bool:
        return super()._same_allocation(spec) and spec._options == self._options

    def __repr__(self) -> str:
        return f"SlurmJob({self._meshes!r})"
