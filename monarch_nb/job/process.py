"""Jobs on this machine: ``ProcessJob`` (each host a local host agent process) and
``LocalJob`` (every mesh is ``this_host()``)."""

from __future__ import annotations

from collections.abc import Sequence

from ..client.cluster import this_host
from .cluster_job import ClusterJob, check_meshes
from .job import JobState, JobTrait


class ProcessJob(ClusterJob):
    """Hosts that are processes on this machine: ``ProcessJob({"trainers": 2,
    "dataloaders": 1})`` gives ``state.trainers`` (extent ``{"hosts": 2}``) and
    ``state.dataloaders`` (``{"hosts": 1}``), three host agents of one local cluster.
    Useful for trying multi-host programs without a scheduler.

    ``cluster``: run them as the retained cluster of that name (it outlives this
    client until ``kill()``) instead of an ephemeral one that ends with this process.
    ``env`` (Monarch's extra environment for the workers) is not supported: raises
    ``NotImplementedError``; set the variables in this process before ``state()``,
    host agents and procs inherit them."""

    def __init__(self, meshes: dict[str, int], env: dict[str, str] | None = None, *, cluster: str | None = None):
        super().__init__()
        self._meshes = check_meshes(meshes)
        self._cluster_name = cluster
        if env:
            raise NotImplementedError("monarch_nb's ProcessJob has no env=: set the variables in os.environ before "
                                      "job.state() (host agents and their procs inherit this process's environment)")

    def __repr__(self) -> str:
        return f"ProcessJob({self._meshes!r})"


class LocalJob(JobTrait):
    """Every named host mesh is ``this_host()``: a stand-in that lets a program switch
    between a real job and this machine by changing only its job."""

    def __init__(self, hosts: Sequence[str] = ("hosts",)):
        super().__init__()
        self._host_names = tuple(hosts)

    def _create(self, client_script: str | None) -> None:
        pass  # this machine always exists

    def _state(self) -> JobState:
        return JobState({name: this_host() for name in self._host_names})

    def can_run(self, spec: JobTrait) -> bool:
        return False  # nothing to reuse: the spec itself is as good

    def _kill(self) -> None:
        pass
