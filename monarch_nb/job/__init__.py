"""Jobs: Monarch's way to get host meshes (``monarch.job``).

    from monarch_nb.job import ProcessJob

    job = ProcessJob({"trainers": 2, "dataloaders": 1})
    state = job.state(cached_path=None)      # applies the job: starts its hosts
    procs = state.trainers.spawn_procs(per_host={"gpus": 4})
    ...
    job.kill()                               # ends every process of the job

A job is a thin layer over a monarch_nb cluster: applying it starts one cluster whose
hosts come from the matching allocator (:class:`ProcessJob`: local host agents;
:class:`SlurmJob`: a batch job; :class:`SSHJob` / :class:`LoginJob`: agents started
through ``ssh`` or another command prefix) and ``state()`` hands out runs of its hosts
as named host meshes. The contract is in :mod:`.job`, the cluster-backed jobs in
:mod:`.cluster_job`. Sits above ``client`` (and ``allocators``), beside ``actor``.
"""

from ..client import absent as _absent
from .cluster_job import ClusterJob
from .commands import exec_command
from .job import DEFAULT_JOB_PATH, JobState, JobTrait, job_load, job_loads
from .login import LoginJob, SSHJob
from .process import LocalJob, ProcessJob
from .slurm import SlurmJob

__all__ = ["ClusterJob", "DEFAULT_JOB_PATH", "JobState", "JobTrait", "LocalJob", "LoginJob", "ProcessJob",
           "SSHJob", "SlurmJob", "exec_command", "job_load", "job_loads"]

# Monarch's names monarch_nb leaves out: importable, and NotImplementedError naming them
# when used (monarch_nb.client.absent; listed in docs/compatibility.md).
__getattr__ = _absent.module_getattr("monarch.job", {
    "load_current_job": "no current-job file; keep the job object, or job_load(path) a pickled one",
    "set_current_job": "no current-job file; keep the job object, or job_load(path) a pickled one",
    "MeshAdminConfig": "the mesh admin server is not built (see cluster.health() and the health widget)",
    "TelemetryConfig": "telemetry (OpenTelemetry metrics and traces) is not built",
    "PortForwarder": "port forwarding to a job's hosts is not built",
    "shell": "an interactive shell on a job's hosts is not built; exec_command runs a command there",
})
