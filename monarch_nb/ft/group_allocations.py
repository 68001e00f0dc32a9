"""Replica groups each on an allocation of its own (``ReplicaGroups(allocator=...)``):
every group, and the warm spare, runs on hosts from its own allocation (a Slurm job of
its own with ``SlurmAllocator``, see ``Cluster.allocate``), as TorchFT's Monarch example
runs one job per replica group. A group that fails with its hosts live is started again
on them; one whose allocation lost a host (a node failed, its job was cancelled or
preempted) gives that allocation back and gets a new one, while the other groups'
jobs run on untouched.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable

from ..client.allocations import allocate, release
from ..client.host_mesh import HostMesh
from ..client.proc_mesh import ProcMesh
from .placement import SPARE, Key, lost_hosts, tear_down


class AllocationPlacement:
    """Allocations from ``allocator`` (a template: each allocation is made from its
    spec), named ``{name}_{key}_{n}``, in the cluster of ``hosts``: one per group key at a
    time."""

    def __init__(self, hosts: HostMesh, name: str, allocator):
        if not callable(getattr(allocator, "spec", None)) or not hasattr(allocator, "hosts"):
            raise TypeError(f"ReplicaGroups: allocator={allocator!r}: give an allocator such as "
                            "monarch_nb.SlurmAllocator(nodes=1), one allocation of it per group")
        self._hosts, self._name, self._allocator = hosts, name, allocator
        self._lock = threading.Lock()
        self._held: dict[Key, tuple[str, HostMesh]] = {}  # group key -> (allocation name, its hosts)
        self._numbers = itertools.count()

    def lost(self) -> set[str]:
        return lost_hosts(self._hosts)

    def tear_down(self, procs: ProcMesh) -> None:
        tear_down(procs, self.lost())

    def hosts_for(self, key: Key, now: list[str], taken: Iterable[str]) -> HostMesh:
        """Group ``key``'s allocation while none of its hosts is lost; else it is given
        back and a new one is made (blocking: a Slurm job's queue wait included). Raises
        :class:`ClusterError` with the allocator's account when the new hosts don't come
        up."""
        with self._lock:
            held = self._held.get(key)
        if held is not None and not self.lost() & set(held[1]._hosts):
            return held[1]
        self.release(key)
        allocation = f"{self._name}_{key}_{next(self._numbers)}"
        mesh = allocate(self._hosts._hub(), allocation, allocator=self._allocator)
        with self._lock:
            self._held[key] = (allocation, mesh)
        return mesh

    def took_spare(self, key: Key) -> None:
        """Group ``key`` runs on the spare's allocation from now on; its own is given back."""
        self.release(key)
        with self._lock:
            spare = self._held.pop(SPARE, None)
            if spare is not None:
                self._held[key] = spare

    def release(self, key: Key) -> None:
        """Give group ``key``'s allocation back (its procs stop, its job ends). Blocking."""
        with self._lock:
            held = self._held.pop(key, None)
        if held is not None:
            release(self._hosts._hub(), held[0])

    def stop(self) -> None:
        """Give every allocation back, blocking; raises the first failure once all were tried."""
        with self._lock:
            keys = list(self._held)
        failures = []
        for key in keys:
            try:
                self.release(key)
            except Exception as e:  # noqa: BLE001 - the others are still given back
                failures.append(e)
        if failures:
            raise failures[0]
