"""``attach_to_workers``: a host mesh over workers started beforehand with
``run_worker_loop_forever`` (Monarch's way of running on machines it did not start)."""

from __future__ import annotations

from typing import Any

from ..allocators.workers import WorkersAllocator
from ..host.worker import TRUST_ALL, check_ca
from .cluster import Cluster
from .host_mesh import HostMesh


def attach_to_workers(workers: list[Any], ca: str = TRUST_ALL, name: str | None = None) -> HostMesh:
    """A new cluster whose hosts are ``workers`` (their addresses, or futures of them),
    in order; returns its host mesh, extent ``{"hosts": N}``. Each worker becomes the
    cluster's host agent on its machine (see ``monarch_nb.host.worker``: it must see the
    cluster directory at the same path). ``shutdown()`` of the returned mesh ends the
    cluster and with it the workers, as in Monarch; so does this script's exit.

    Blocks until every agent has reported. Raises ``NotImplementedError`` for a ``ca``
    other than ``"trust_all_connections"`` and :class:`ClusterError` when a worker does
    not answer or its agent does not start. ``name`` is accepted for Monarch
    compatibility."""
    check_ca(ca)
    addresses = [w if isinstance(w, str) else w.get() for w in workers]
    cluster = Cluster.start_ephemeral(allocator=WorkersAllocator(addresses))
    hosts = cluster.host_mesh()
    hosts._release = cluster.stop
    return hosts
