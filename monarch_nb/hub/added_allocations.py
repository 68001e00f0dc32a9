"""Allocations added to a running cluster (``Cluster.allocate``): more hosts, each set
from an allocation of its own (a Slurm job, or local host agents), that can be given
back alone (``HostMesh.shutdown()`` of its mesh) while the rest of the cluster runs.

This is what replica groups on Slurm need (TorchFT's Monarch example allocates one job
per replica group): a group whose machine failed gets a new job, and its old one is
cancelled, without touching the others' jobs or the controller's.

An added allocation is in the state file from the moment it starts (its Slurm job id
once submitted), so a recovering hub adopts its agents, a stopping hub ends it, and
``cluster stop`` of a dead hub cancels its job. Its hosts are watched as the cluster's
own are: a job that ends from outside fails its hosts with the job's state.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path

from ..allocators import base as allocators
from ..protocol import agent_ops, envelope, hub_ops
from ..wire.aio import AioEndpoint
from .allocation import Allocation
from .errors import HubError
from .mesh_ops import MeshOps
from .registry import Registry

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]{0,47}")
STOP_AGENTS_S = 5.0  # how long a release waits for agents told to shut down before ending them


class AddedAllocations:
    """The ``allocate`` and ``release`` ops: allocations kept in
    ``registry.allocations`` (name -> allocator), their agents awaited through
    ``allocation``, their procs stopped through ``meshes``."""

    def __init__(self, path: Path, grace_s: float, registry: Registry, net: AioEndpoint,
                 allocation: Allocation, meshes: MeshOps, stop_requested: asyncio.Event):
        self._path, self._grace_s = path, grace_s
        self._registry, self._net = registry, net
        self._allocation, self._meshes = allocation, meshes
        self._stop_requested = stop_requested
        # name -> (give up its start, its start has ended) for allocations still starting
        self._starting: dict[str, tuple[asyncio.Event, asyncio.Event]] = {}
        self._unfinished: list[str] = []  # restored allocations that were still starting

    def restore(self, saved: dict) -> None:
        """A recovering hub's: the added allocations of its predecessor, whose agents
        ``Allocation.adopt`` then takes over."""
        for name, added in saved.get("allocations", {}).items():
            allocator = allocators.create(added["spec"], str(self._path), self._grace_s, name)
            allocator.host_ids = list(added["hosts"])
            self._registry.allocations[name] = allocator
            if not allocator.host_ids or not all(h in saved["hosts"] for h in allocator.host_ids):
                self._unfinished.append(name)  # (no hosts at all: saved before its start returned)

    async def end_unfinished(self) -> None:
        """A recovering hub's, once it has adopted the agents: end the allocations that
        were still starting when its predecessor died (a Slurm job in the queue, say).
        Their ``allocate()`` failed with the hub, and nothing would end them before
        ``Cluster.stop()``; allocating the name again starts anew."""
        for name in self._unfinished:
            print(f"monarch_nb hub: allocation {name!r} was still starting when the previous hub died; "
                  "ending it (allocate it again)", file=sys.stderr)
            allocator = self._registry.allocations[name]
            await self._end(name, allocator)
            # The previous hub may have died between submitting its job and writing the
            # job's id to the state file: the job is then found by its name (this user's
            # Slurm jobs of the allocation's job name); else it stayed queued, and ran.
            await asyncio.get_running_loop().run_in_executor(
                None, allocators.release_leftovers, str(self._registry.path), allocator.spec())
        self._unfinished = []

    async def allocate(self, header, message):
        """Start allocation ``allocation`` of ``host_count`` hosts from the allocator
        ``allocator`` (a spec) and reply with their ids once every agent has reported.
        Fails (with why, the allocation ended) when they don't within the allocator's
        start timeout, when its allocation ends first, or when the cluster stops."""
        name, spec, count = header[hub_ops.ALLOCATION], header[hub_ops.ALLOCATOR_SPEC], header[hub_ops.HOST_COUNT]
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise HubError(f"allocation name {name!r}: give letters, digits and _ (at most 48, not starting "
                           "with _)", "ValueError")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise HubError(f"hosts={count!r}: give a whole number, 1 or more", "ValueError")
        existing = self._registry.allocations.get(name)
        if existing is not None:
            same_kind = isinstance(spec, dict) and existing.kind == spec.get("kind", "local")
            if name not in self._starting and len(existing.host_ids) == count and same_kind:
                return {hub_ops.HOSTS: list(existing.host_ids)}  # a re-run cell: the same hosts
            if name in self._starting:
                raise HubError(f"an allocation named {name!r} is starting (another allocate() of it); allocate it "
                               "again once that returns to get its hosts, or choose another name", "ValueError")
            raise HubError(f"an allocation named {name!r} exists ({len(existing.host_ids)} host(s) from the "
                           f"{existing.kind} allocator); give it back "
                           "first (shutdown() of its host mesh) or choose another name", "ValueError")
        try:
            allocator = allocators.create(spec, str(self._path), self._grace_s, name)
        except (ValueError, TypeError) as e:
            raise HubError(f"allocation {name!r}: {e}", "ValueError") from None
        # In the registry (and so the state file, and a stop) from now on.
        self._registry.allocations[name] = allocator
        give_up, ended = asyncio.Event(), asyncio.Event()
        self._starting[name] = (give_up, ended)
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        try:
            # On disk before its start: a hub that dies from here on leaves its successor an
            # allocation still starting, which it ends (its job found by name if this hub
            # died before it saved the job's id: end_unfinished).
            await self._registry.save()
            try:
                host_ids = await loop.run_in_executor(None, allocator.start, self._net.address, count)
            except Exception as e:  # sbatch refused the job, or the like
                why = f"could not get hosts from the {allocator.kind} allocator: {e}"
            else:
                await self._registry.save()  # its job id, before waiting in the queue
                why = await self._allocation.wait_for_agents(
                    allocator, host_ids, t0, lambda: self._stop_requested.is_set() or give_up.is_set())
            if give_up.is_set():
                why = "given back while it was starting (release, or its allocate() interrupted)"
            if why:
                await self._end(name, allocator)
        finally:
            del self._starting[name]
            ended.set()
        if why:
            raise HubError(f"allocation {name!r}: {why}")
        print(f"monarch_nb hub: allocation {name!r}: hosts {', '.join(host_ids)} up in "
              f"{time.monotonic() - t0:.1f} s", file=sys.stderr)
        await self._registry.save()  # with its hosts: a recovering hub adopts them
        return {hub_ops.HOSTS: host_ids}

    async def release(self, header, message):
        """Give allocation ``allocation`` back: stop the proc meshes on its hosts, shut
        its agents down and end the allocation (cancel its job). One still starting has
        its start given up (its ``allocate`` fails saying so); replied once it has ended.
        With ``starting_only``, only one still starting."""
        name = header[hub_ops.ALLOCATION]
        starting = self._starting.get(name) if isinstance(name, str) else None
        if starting is not None:  # its allocate gives the start up and ends it
            give_up, ended = starting
            give_up.set()
            await ended.wait()
            return {}
        if header.get(hub_ops.STARTING_ONLY):
            return {}  # an interrupted allocate() of an allocation that had started: it stays
        allocator = self._registry.allocations.get(name) if isinstance(name, str) else None
        if allocator is None:
            raise HubError(f"no allocation named {name!r}; this cluster has "
                           f"{sorted(self._registry.allocations) or 'none'}", "ValueError")
        hosts = set(allocator.host_ids)
        for record in [m for m in self._registry.proc_meshes.values() if any(p.host_id in hosts for p in m.procs)]:
            await self._meshes.stop_proc_mesh(record)
        await self._end(name, allocator)
        return {}

    async def _end(self, name: str, allocator) -> None:
        """Shut the agents of ``allocator`` down, end its allocation, and forget it."""
        hosts = [h for h in allocator.host_ids if h in self._registry.hosts]
        self._allocation.released.update(allocator.host_ids)
        await asyncio.gather(*(self._net.send(self._registry.hosts[h].address, {envelope.OP: agent_ops.SHUTDOWN})
                               for h in hosts if not self._registry.hosts[h].lost), return_exceptions=True)
        try:
            await asyncio.get_running_loop().run_in_executor(None, allocator.stop, STOP_AGENTS_S)
        except Exception as e:  # scancel failing: said in hub.log; the job's state says the rest
            print(f"monarch_nb hub: allocation {name!r}: could not end it: {e}", file=sys.stderr)
        for host_id in hosts:
            self._net.forget(self._registry.hosts.pop(host_id).address)
        self._allocation.released.difference_update(allocator.host_ids)  # its agents have exited
        self._registry.allocations.pop(name, None)
        await self._registry.save()
