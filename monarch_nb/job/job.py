"""The job contract (Monarch's ``JobTrait``), the host meshes it yields (``JobState``)
and a job's cached copy on disk.

A job is a specification of hosts ("two hosts named ``trainers``, one named
``dataloaders``") plus, once applied, the allocation that satisfies it. ``state()``
applies the job when needed and returns its host meshes by name; ``kill()`` ends the
allocation. By default ``state()`` also pickles the applied job to
``.monarch/job_state.pkl`` and, next time (in this process or another), reuses the
allocation found there when it is still running and fits the specification.
"""

from __future__ import annotations

import atexit
import os
import pickle
import uuid
from abc import ABC, abstractmethod

from ..client.host_mesh import HostMesh
from . import batch

DEFAULT_JOB_PATH = ".monarch/job_state.pkl"


class JobState:
    """The host meshes of an applied job, by name: ``state.trainers`` is the
    :class:`HostMesh` of the mesh named ``trainers`` (extent ``{"hosts": N}``).
    Reading a name the job does not have raises ``AttributeError`` listing the names."""

    def __init__(self, hosts: dict[str, HostMesh]):
        self._hosts = hosts

    def __getattr__(self, name: str) -> HostMesh:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self.__dict__["_hosts"][name]
        except KeyError:
            raise AttributeError(f"{name!r} is not a host mesh of this job; its meshes: "
                                 f"{', '.join(sorted(self.__dict__.get('_hosts', {})))}") from None

    def __repr__(self) -> str:
        return f"JobState(hosts={self._hosts!r})"


class JobTrait(ABC):
    """A specification of hosts and, once applied, the allocation that satisfies it.

    Subclasses implement four hooks: ``_create`` (allocate), ``_state`` (the host
    meshes of the allocation), ``can_run(spec)`` (could this allocation serve
    ``spec``, e.g. a cached job for a fresh one) and ``_kill`` (release it). ``apply``,
    ``state``, ``kill`` and caching are common to every kind of job. Jobs pickle; the
    allocation they name survives pickling (a job loaded elsewhere reconnects to it).
    """

    def __init__(self):
        # "running" once applied, until kill(); a loaded job whose allocation this one
        # uses (found in the cache by state()); else "not_running"
        self._status: "str | JobTrait" = "not_running"
        self._apply_id: str | None = None
        # batch mode (apply(client_script=...)): the client script's process, not pickled,
        # and the folder of its stdout.log and stderr.log (Monarch's attribute name)
        self._batch_process = None
        self._log_dir: str | None = None

    # the hooks -------------------------------------------------------------------------
    @abstractmethod
    def _create(self, client_script: str | None) -> None:
        """Allocate the hosts (blocks until they are up)."""

    @abstractmethod
    def _state(self) -> JobState:
        """The host meshes of the running allocation."""

    @abstractmethod
    def can_run(self, spec: "JobTrait") -> bool:
        """Whether this job's running allocation serves the specification ``spec``."""

    @abstractmethod
    def _kill(self) -> None:
        """Release the allocation (blocks until its processes have ended)."""

    # common to every job ---------------------------------------------------------------
    @property
    def _running(self) -> "JobTrait | None":
        """The job whose allocation this one uses: itself once applied, a cached job, or None."""
        if isinstance(self._status, JobTrait):
            return self._status
        return self if self._status == "running" else None

    @property
    def active(self) -> bool:
        """True from ``apply()`` (or reuse of a cached allocation) until ``kill()``."""
        return self._running is not None

    @property
    def apply_id(self) -> str | None:
        """A fresh id for each allocation ``apply()`` makes (kept by a cached copy);
        ``None`` while the job does not run."""
        running = self._running
        return running._apply_id if running is not None else None

    def apply(self, client_script: str | None = None) -> None:
        """Allocate the hosts unless this job already runs (then a no-op); blocks until
        they are up.

        ``client_script`` (batch mode, see :mod:`monarch_nb.job.batch`): after
        allocating, pickle this job to ``.monarch/job_state.pkl`` and start ``python
        client_script`` in the background with ``MONARCH_BATCH_JOB=1``; in it, any job's
        ``state()`` gets this job's host meshes, and the allocation ends when the script
        exits. Returns at once; :attr:`process` is the script's ``Popen``, its output
        goes to ``stdout.log`` and ``stderr.log`` under ``.monarch/logs/job_*/``.
        Raises ``FileNotFoundError`` for a script that is not there (before allocating), ``RuntimeError``
        when the job already runs (kill it first), and what :meth:`_check_batch` raises
        for a job that cannot hand its allocation to another process."""
        if client_script is not None:
            if self.active:
                raise RuntimeError("apply(client_script=...) on a job that already runs: its client is this "
                                   "program; call job.kill() first to batch-launch the script on a fresh allocation")
            self._check_batch()
            if not os.path.isfile(client_script):
                raise FileNotFoundError(f"apply(client_script={client_script!r}): no such file; give the path of a "
                                        "Python script (relative to the current directory, or absolute)")
        if not self.active:
            self._create(None)
            self._apply_id = str(uuid.uuid4())
            self._status = "running"
        if client_script is not None:
            BatchJob(self).dump(DEFAULT_JOB_PATH)
            client = batch.start_client(client_script)
            self._batch_process, self._log_dir = client.process, client.log_dir

    def _check_batch(self) -> None:
        """Raise if this job's allocation cannot outlive this process for a batch
        client (subclasses whose allocation ends with this process say so)."""

    @property
    def process(self):
        """The batch client started by ``apply(client_script=...)`` (a
        ``subprocess.Popen``); ``ValueError`` when this job started none."""
        if self._batch_process is None:
            raise ValueError("no batch client: this job was not applied with apply(client_script=...) here")
        return self._batch_process

    def state(self, cached_path: str | None = DEFAULT_JOB_PATH) -> JobState:
        """The job's host meshes by name, applying the job first if it does not run.

        With ``cached_path`` (default ``.monarch/job_state.pkl``), a job pickled there
        whose allocation still runs and fits this specification is reused instead of
        allocating anew (one that does not fit is killed and its file removed), and a
        newly applied job is saved there. ``None``: no file is read or written."""
        if not self.active:
            cached = _load_cached(cached_path, self)
            if cached is not None:
                self._status = cached
            else:
                self.apply()
                if cached_path is not None:
                    self.dump(cached_path)
        return self._running._state()

    def kill(self) -> None:
        """Release the allocation, ending every process of it; blocks until they have
        ended. A job that does not run is left as it is."""
        running = self._running
        if running is not None:
            running._kill()
            running._status = "not_running"
        self._status = "not_running"

    def dump(self, filename: str) -> None:
        """Pickle this job to ``filename`` (following a symlink there; parent
        directories are made)."""
        path = os.path.realpath(filename)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            pickle.dump(self, f)

    def dumps(self) -> bytes:
        return pickle.dumps(self)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_batch_process"] = None  # a process handle of this process only
        return state

    # Monarch's optional services, which monarch_nb does not have ---------------------
    def enable_telemetry(self, *args, **kwargs):
        raise NotImplementedError("monarch_nb jobs have no telemetry services (enable_telemetry); "
                                  "use cluster.health() and cluster.logs()")

    def enable_admin(self, *args, **kwargs):
        raise NotImplementedError("monarch_nb jobs have no mesh admin agent (enable_admin)")

    def remote_mount(self, *args, **kwargs):
        raise NotImplementedError("monarch_nb jobs cannot mount directories on workers (remote_mount); "
                                  "procs import from the client's sys.path, which must be on a shared filesystem")

    def gather_mount(self, *args, **kwargs):
        raise NotImplementedError("monarch_nb jobs cannot mount workers' directories here (gather_mount)")


class BatchJob(JobTrait):
    """The applied job ``job`` as its batch client loads it (see :mod:`.batch`):
    ``can_run`` any specification in a batch client (and then ends the allocation when
    that client exits), none elsewhere; the host meshes are ``job``'s."""

    def __init__(self, job: JobTrait):
        super().__init__()
        self._job = job
        self._status = "running"
        self._apply_id = job.apply_id

    def _create(self, client_script: str | None) -> None:
        self._job._create(client_script)

    def _state(self) -> JobState:
        return self._job._state()

    def can_run(self, spec: JobTrait) -> bool:
        if not batch.in_batch_job():
            return False
        atexit.register(self._kill)  # the batch client's end is the job's end
        return True

    def _kill(self) -> None:
        self._job._kill()

    def __repr__(self) -> str:
        return f"BatchJob({self._job!r})"


def job_loads(data: bytes) -> JobTrait:
    """The job pickled in ``data`` (by :meth:`JobTrait.dumps`). Unpickling runs code:
    load only what you wrote."""
    return pickle.loads(data)


def job_load(filename: str = DEFAULT_JOB_PATH) -> JobTrait:
    """The job pickled to ``filename`` (by :meth:`JobTrait.dump`); raises
    ``FileNotFoundError`` when there is none."""
    with open(filename, "rb") as f:
        return pickle.load(f)


def _load_cached(cached_path: str | None, spec: JobTrait) -> JobTrait | None:
    """The job cached at ``cached_path`` if it runs and can run ``spec``. One that
    runs but cannot is killed, and its file removed, so that it does not linger."""
    if cached_path is None:
        return None
    try:
        cached = job_load(cached_path)
    except FileNotFoundError:
        return None
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        cached = None  # written by another version, or cut short: allocate anew
    if cached is not None and cached.active and cached.can_run(spec):
        return cached
    if cached is not None and cached.active:
        cached.kill()
    try:
        os.remove(os.path.realpath(cached_path))
    except FileNotFoundError:
        pass
    return None
