"""Hosts added to a running cluster, each set from an allocation of its own
(``Cluster.allocate``): a Slurm job per replica group, say, given back alone with
``HostMesh.shutdown()`` while the rest of the cluster runs (``hub.added_allocations``)."""

from __future__ import annotations

import sys
from typing import Any

from ..protocol import hub_ops
from .host_mesh import HostMesh
from .hub_client import HubClient

# How long allocate() waits beyond the allocator's own start timeout (a queue wait
# included) for the hub to answer.
ANSWER_MARGIN_S = 30.0
LOCAL_START_TIMEOUT_S = 60.0  # the local allocator's (allocators.local)
GIVE_UP_S = 60.0  # how long an interrupted allocate() waits for its start to be given up


def every_host(info: dict) -> list[dict]:
    """Every host of a cluster's ``info()``: its own, then each added allocation's."""
    return info["hosts"] + [h for added in info.get("allocations", {}).values() for h in added["hosts"]]


def allocation_spec(allocator, hosts: int | None) -> tuple[dict, int]:
    """The allocator spec the hub starts the allocation from, and its number of hosts.
    Raises ``TypeError`` for something that is not an allocator, ``ValueError`` for a
    ``hosts`` that disagrees with it or is below 1."""
    if allocator is None:
        count = 1 if hosts is None else hosts
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"hosts={hosts!r}: give a whole number, 1 or more")
        return {"kind": "local"}, count
    if isinstance(allocator, type) or not callable(getattr(allocator, "spec", None)) or not hasattr(allocator, "hosts"):
        raise TypeError(f"allocator={allocator!r}: give an allocator such as "
                        "monarch_nb.SlurmAllocator(nodes=2) (an instance, not the class), or None for local hosts")
    if hosts is not None and hosts != allocator.hosts:
        raise ValueError(f"hosts={hosts} but the allocator gives {allocator.hosts}; leave hosts out "
                         "(the allocator decides, e.g. SlurmAllocator(nodes=...))")
    return allocator.spec(), allocator.hosts


def allocate(hub: HubClient, name: str, hosts: int | None = None, allocator=None) -> HostMesh:
    """See ``Cluster.allocate``."""
    spec, count = allocation_spec(allocator, hosts)
    timeout = getattr(allocator, "start_timeout_s", LOCAL_START_TIMEOUT_S) + ANSWER_MARGIN_S
    fields: dict[str, Any] = {hub_ops.ALLOCATION: name, hub_ops.ALLOCATOR_SPEC: spec, hub_ops.HOST_COUNT: count}
    try:
        reply = hub.request(hub_ops.ALLOCATE, timeout=timeout, **fields)
    except KeyboardInterrupt:
        give_up_start(hub, name)
        raise
    return allocated_mesh(hub, name, reply[hub_ops.HOSTS])


def give_up_start(hub: HubClient, name: str) -> None:
    """An interrupted ``allocate``'s: give allocation ``name`` back if it is still
    starting (its Slurm job perhaps waiting in the queue), so that neither the job nor
    the name stays taken until its start timeout; one that had started stays (a re-run
    cell's). Blocks until it has ended; a second Ctrl-C leaves it to its start timeout."""
    fields: dict[str, Any] = {hub_ops.ALLOCATION: name, hub_ops.STARTING_ONLY: True}
    try:
        hub.request(hub_ops.RELEASE, timeout=GIVE_UP_S, **fields)
    except Exception as e:  # the hub gone, say: the start ends at its timeout, or with the cluster
        print(f"monarch_nb: could not give back allocation {name!r} after the interrupt ({e}); "
              "it ends at its start timeout, or with Cluster.stop()", file=sys.stderr)


def allocated_mesh(hub: HubClient, name: str, host_ids: list[str]) -> HostMesh:
    """An owned handle on allocation ``name``'s hosts (``{"hosts": N}``), whose
    ``shutdown()`` gives the allocation back."""
    mesh = HostMesh(hub.cluster_id, hub.address, list(host_ids))
    mesh._release = lambda: release(hub, name)
    return mesh


def release(hub: HubClient, name: str) -> None:
    """Give allocation ``name`` back: its procs and host agents stop and its allocation
    ends (its Slurm job is cancelled). Blocks until they have. Raises
    :class:`InvalidRequest` for an unknown name."""
    fields: dict[str, Any] = {hub_ops.ALLOCATION: name}
    hub.request(hub_ops.RELEASE, timeout=120.0, **fields)
