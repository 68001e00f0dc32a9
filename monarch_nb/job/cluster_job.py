"""``ClusterJob``: a job whose allocation is a monarch_nb cluster.

Applying the job starts one cluster whose hosts come from the job's allocator (local
host agents, a Slurm batch job, agents started through ``ssh``...); its named host
meshes are consecutive runs of that cluster's hosts, in the order the meshes were
given. The cluster is ephemeral (it ends with this process) unless the job was given
a ``cluster`` name: then it is a retained cluster of that name, which outlives the
client until ``kill()`` and which other clients can ``monarch_nb.connect(name)`` to.
"""

from __future__ import annotations

import re
from contextlib import contextmanager

from ..client.cluster import Cluster, connect
from ..client.runtime import runtime
from ..errors import ClusterError, ClusterNotFound
from .job import JobState, JobTrait

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def check_meshes(meshes) -> dict[str, int]:
    """``meshes`` (mesh name -> number of hosts) as a dict; raises ``ValueError`` for
    names that are not identifiers (``state.NAME`` reads them) or counts below 1."""
    if not hasattr(meshes, "items"):
        raise TypeError(f"meshes={meshes!r}: give a dict of mesh name -> number of hosts, e.g. {{'hosts': 2}}")
    for name, count in meshes.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"mesh name {name!r}: give an identifier (it is read as state.{name})")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"mesh {name!r} has {count!r} hosts: give a whole number >= 1")
    return dict(meshes)


@contextmanager
def _keeping_this_host():
    """Leave ``this_host()`` as it was: ``Cluster.start`` and ``connect`` make their
    cluster this process's current one, but a job's cluster is not (in Monarch,
    ``this_host()`` is this machine whatever jobs run)."""
    rt = runtime()
    with rt.cluster_lock:
        before = rt.cluster
    try:
        yield
    finally:
        with rt.cluster_lock:
            rt.cluster = before


class ClusterJob(JobTrait):
    """A job over one monarch_nb cluster (see the module docstring). Subclasses set
    ``_meshes`` (mesh name -> hosts) and ``_cluster_name``, and give the allocator in
    :meth:`_allocator`."""

    _meshes: dict[str, int]
    _cluster_name: str | None  # a retained cluster's name; None: ephemeral

    def __init__(self):
        super().__init__()
        self._cluster: Cluster | None = None  # live in this process; not pickled
        self._started_name: str | None = None  # the running cluster's name (pickled)

    def _allocator(self):
        """Where the hosts come from: an allocator such as ``SlurmAllocator`` giving
        :meth:`hosts` hosts, or ``None`` for local host agents."""
        return None

    def hosts(self) -> int:
        """Hosts the job asks for: the sum over its meshes."""
        return sum(self._meshes.values())

    def _create(self, client_script: str | None) -> None:
        allocator = self._allocator()
        if self._cluster_name is None:
            self._cluster = Cluster.start_ephemeral(hosts=self.hosts(), allocator=allocator)
        else:
            with _keeping_this_host():
                self._cluster = Cluster.start(self._cluster_name, hosts=None if allocator else self.hosts(),
                                              allocator=allocator)
        self._started_name = self._cluster.name

    def _live_cluster(self) -> Cluster | None:
        """The running cluster: the one this process started, else (a job loaded from
        its cache) reconnected by name; ``None`` once it has ended."""
        if self._cluster is None and self._started_name is not None:
            try:
                with _keeping_this_host():
                    self._cluster = connect(self._started_name)
            except ClusterNotFound:
                return None
        return self._cluster

    def _state(self) -> JobState:
        cluster = self._live_cluster()
        if cluster is None:
            raise RuntimeError(f"the cluster of this job ({self._started_name}) has ended; "
                               "call job.kill() and then job.state() to allocate anew")
        whole = cluster.host_mesh()
        if len(whole) != self.hosts():
            raise RuntimeError(f"the cluster of this job has {len(whole)} hosts, not the {self.hosts()} it asked "
                               "for (a host was lost?); call job.kill() and then job.state() to allocate anew")
        meshes, start = {}, 0
        for name, count in self._meshes.items():
            meshes[name] = whole._owned_slice(hosts=slice(start, start + count))
            start += count
        return JobState(meshes)

    def can_run(self, spec: JobTrait) -> bool:
        """True when ``spec`` is the same kind of job asking for the same meshes, and
        this job's cluster still runs with all its hosts."""
        if type(spec) is not type(self) or spec._meshes != self._meshes or not self._same_allocation(spec):
            return False
        try:
            cluster = self._live_cluster()
            return cluster is not None and len(cluster.host_mesh()) == self.hosts()
        except ClusterError:
            return False

    def _same_allocation(self, spec: "ClusterJob") -> bool:
        """Whether ``spec`` asks for hosts of the same kind (subclasses compare their options)."""
        return spec._cluster_name == self._cluster_name

    def _kill(self) -> None:
        cluster = self._live_cluster()
        if cluster is not None:
            cluster.stop()
        self._cluster = self._started_name = None

    def _check_batch(self) -> None:
        if self._cluster_name is None:
            raise ValueError(f"{type(self).__name__}(...).apply(client_script=...) needs a retained cluster: the "
                             "ephemeral one ends with this process, before its batch client could use it; pass "
                             "cluster='NAME' to the job")

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_cluster"] = None  # reconnected by name where the job is loaded
        return state
