"""The hub's side of allocation: getting host agents through the cluster's allocator,
and failing hosts whose allocation ended from outside.

Starting waits for every agent to report, up to the allocator's ``start_timeout_s``
(a Slurm job may wait in the queue); while it waits it asks the allocator once a
second whether the allocation already ended (a job that failed at once), so such a
start fails at once with the allocator's account (job state and reason), not at the
timeout. Once running, the same check finds allocations ended from outside (a
cancelled or timed-out job): their hosts are marked failed with that cause and every
call waiting on their procs fails with ``SupervisionError``. An agent stopped by a
signal says so first (``agent_exiting``), which is faster still.

A recovering hub adopts the host agents of its predecessor instead (``adopt``).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from ..protocol import agent_ops, envelope, gpus, router_ops
from ..protocol.records import LOST_EXIT_CODE
from ..wire.aio import AioEndpoint
from . import state
from .mesh_ops import MeshOps
from .records import HostRecord
from .registry import Registry
from .supervision import Supervision

ALLOCATION_POLL_S = 1.0  # how often the allocator is asked whether the allocation ended
ADOPT_TIMEOUT_S = 3.0  # how long a recovering hub waits for each host agent to answer


class Allocation:
    """The hosts of ``registry``: ``n_hosts`` from ``allocator`` (whose waits end
    early when ``stop_requested`` is set or the cluster directory ``path`` is removed),
    or adopted from a previous hub. A host whose allocation ended is failed through
    ``supervision``; meshes whose procs all vanished while no hub watched are
    forgotten through ``meshes``."""

    def __init__(self, allocator, n_hosts: int, path: Path, registry: Registry, net: AioEndpoint,
                 supervision: Supervision, meshes: MeshOps, stop_requested: asyncio.Event):
        self.allocator = allocator
        self._n_hosts = n_hosts
        self._path = path
        self._registry = registry
        self._net = net
        self._supervision = supervision
        self._meshes = meshes
        self._stop_requested = stop_requested
        self._reported = asyncio.Event()  # set whenever an agent reports (waiters clear it)
        self.released: set[str] = set()  # host ids of allocations given back (Allocations.release)
        self._started = time.time()  # (payloads written since are this hub's own)

    async def agent_ready(self, header, message):
        registry = self._registry
        host_id = header[agent_ops.HOST_ID]
        if host_id in self.released:
            return  # an agent of an allocation given back while it started: being stopped
        registry.hosts[host_id] = HostRecord(host_id, header["address"], header["pid"], header["hostname"],
                                             node=header.get("node", ""), gpus=header.get(gpus.AGENT_GPUS) or [],
                                             router=header.get(router_ops.ROUTER_ADDRESS, ""))
        self._reported.set()

    def owner(self, host_id: str):
        """The allocator that holds ``host_id``: an added allocation's, else the cluster's own."""
        return next((a for a in self._registry.allocations.values() if host_id in a.host_ids), self.allocator)

    async def adopt(self, saved: dict) -> None:
        """Take over the host agents and meshes of a previous hub of this cluster.

        Agents that answer are told this hub's address and report which procs are still
        running; procs that exited meanwhile are marked so, and hosts that don't answer
        within ``ADOPT_TIMEOUT_S`` are dropped with their procs."""
        registry = self._registry
        hosts: dict[str, HostRecord] = saved["hosts"]
        registry.proc_meshes, registry.actor_meshes = saved["proc_meshes"], saved["actor_meshes"]
        replies = await asyncio.gather(*(
            self._net.request(h.address, {envelope.OP: agent_ops.ADOPT, agent_ops.HUB: self._net.address},
                              timeout=ADOPT_TIMEOUT_S)
            for h in hosts.values()), return_exceptions=True)
        exited: dict[str, int] = {}
        for host, reply in zip(hosts.values(), replies):
            if isinstance(reply, BaseException):
                print(f"monarch_nb hub: host agent {host.host_id} (pid {host.pid}) did not answer; "
                      "dropping its procs", file=sys.stderr)
                continue
            # Heard now: its saved last_seen is the dead hub's, and with it the first
            # heartbeat after these answers (up to ADOPT_TIMEOUT_S, waiting on a dead host)
            # found every live host silent past HOST_TIMEOUT_S and failed all their calls.
            host.last_seen = time.monotonic()
            registry.hosts[host.host_id] = host
            live = set(reply.header["procs"])
            exited.update({p: code for p, code in reply.header["exited"].items() if p not in live})
            for mesh in registry.proc_meshes.values():
                for proc in mesh.procs:
                    if proc.host_id == host.host_id and proc.proc_id not in live:
                        exited.setdefault(proc.proc_id, LOST_EXIT_CODE)
        registry.host_order = [h for h in saved["host_order"] if h in registry.hosts]
        for allocator in [self.allocator, *registry.allocations.values()]:
            allocator.adopt({h.host_id: h.pid for h in registry.hosts.values() if self.owner(h.host_id) is allocator})
        for mesh in registry.proc_meshes.values():
            for proc in mesh.procs:
                if proc.host_id not in registry.hosts:
                    exited.setdefault(proc.proc_id, LOST_EXIT_CODE)
                if proc.proc_id in exited and proc.exit_code is None:
                    proc.exit_code = exited[proc.proc_id]
        for mesh in list(registry.proc_meshes.values()):
            if all(p.exit_code is not None for p in mesh.procs):
                print(f"monarch_nb hub: every proc of {mesh.name!r} is gone; forgetting it and its actors",
                      file=sys.stderr)
                for actors in [a for a in registry.actor_meshes.values() if a.proc_mesh == mesh.name]:
                    self._meshes.forget_actor_mesh(actors, gone=(
                        f"every proc of {mesh.name!r} was gone when a new hub took the cluster over (recover): "
                        "spawn the procs and actors again"))
                del registry.proc_meshes[mesh.name]
        # Payloads of actor meshes the dead hub was spawning (never registered), or forgot.
        state.drop_unreferenced_payloads(self._path, {a.payload_id for a in registry.actor_meshes.values()},
                                         before=self._started)

    async def acquire_hosts(self, starter_gone=lambda: False) -> bool:
        """Start host agents (unless re-adopted) and wait until all have reported.
        Returns False, after saying why on stderr, when they don't within the
        allocator's ``start_timeout_s`` or its allocation ends first, or when the start
        is abandoned: a stop was requested, the cluster directory was removed, or
        ``starter_gone()`` (the client that started the cluster went away). An abandoned
        start stops starting agents at once: at a few hundred local hosts, starting them
        takes minutes."""
        registry = self._registry
        if registry.hosts:
            return True
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        starting = loop.run_in_executor(None, self.allocator.start, self._net.address, self._n_hosts)
        while not starting.done():
            await asyncio.wait([starting], timeout=ALLOCATION_POLL_S)
            if not starting.done() and self._abandoned(starter_gone):
                self.allocator.cancel_start()
                await asyncio.wait([starting])  # what it started is stopped with the rest
                if starting.exception() is not None:  # (retrieved: given up anyway, not logged as lost)
                    print(f"monarch_nb hub: the {self.allocator.kind} allocator failed while giving up: "
                          f"{starting.exception()}", file=sys.stderr)
                return False
        try:
            registry.host_order = starting.result()
        except Exception as e:  # sbatch refused the job, or the like
            print(f"monarch_nb hub: could not get hosts from the {self.allocator.kind} allocator: {e}",
                  file=sys.stderr)
            return False
        registry.save()  # the allocation (e.g. the job id) is in the state file from now on
        why = await self.wait_for_agents(self.allocator, registry.host_order, t0, lambda: self._abandoned(starter_gone))
        if why:
            print(f"monarch_nb hub: {why}", file=sys.stderr)
        return not why

    async def wait_for_agents(self, allocator, host_ids: list[str], t0: float, abandoned) -> str:
        """Wait until the agents of ``host_ids`` (from ``allocator``, started at
        ``time.monotonic()`` ``t0``) have all reported: ``""``; else why not: the
        allocation ended, ``allocator.start_timeout_s`` passed, or ``abandoned()``."""
        loop = asyncio.get_running_loop()
        timeout = allocator.start_timeout_s
        while True:
            self._reported.clear()
            if all(h in self._registry.hosts for h in host_ids):
                return ""
            try:
                await asyncio.wait_for(self._reported.wait(), ALLOCATION_POLL_S)
                continue
            except asyncio.TimeoutError:
                pass
            if abandoned():
                return "the start was given up"
            os.utime(self._path)  # a long queue wait: clients see a starting cluster, not a stale one
            ended = await loop.run_in_executor(None, allocator.check)
            waited = time.monotonic() - t0
            if ended or waited > timeout:
                why = await loop.run_in_executor(None, allocator.waiting_for)
                missing = [h for h in host_ids if h not in self._registry.hosts]
                return (f"host agents {', '.join(missing)} did not report within {waited:.0f} s"
                        f"{' (the allocation ended)' if ended else f' (start timeout {timeout:.0f} s)'}"
                        f"{'; ' + why if why else ''}")

    def stop(self, timeout: float) -> None:
        """End every allocation, the cluster's own and the added ones (blocking: in a
        worker thread); one that fails to end is said on stderr, the others still end."""
        for allocator in [self.allocator, *self._registry.allocations.values()]:
            try:
                allocator.stop(timeout)
            except Exception as e:  # e.g. a Slurm job that would not end: its id is in the message
                print(f"monarch_nb hub: could not end the {allocator.kind} allocation: {e}", file=sys.stderr)

    def _abandoned(self, starter_gone) -> bool:
        """Whether the start is given up (and why, on stderr)."""
        if self._stop_requested.is_set() or not self._path.is_dir():
            why = "stopped (or the cluster directory was removed)"
        elif starter_gone():
            why = "the client that started this cluster went away"
        else:
            return False
        print(f"monarch_nb hub: {why} while waiting for host agents; stopping", file=sys.stderr)
        return True

    async def watch(self) -> None:
        """Fail the hosts whose allocation ended while the cluster runs. Each allocator
        is asked every ``check_every_s`` seconds (its own, where it has one: a local
        allocator's check is a ``waitpid`` per agent), else every ``ALLOCATION_POLL_S``."""
        loop = asyncio.get_running_loop()
        next_check: dict[int, float] = {}  # id(allocator) -> when (monotonic) to ask it again
        while not self._stop_requested.is_set():
            allocators = [self.allocator, *self._registry.allocations.values()]
            await asyncio.sleep(min(_check_every_s(a) for a in allocators))
            ended: dict[str, str] = {}
            for allocator in allocators:
                now = time.monotonic()
                if now < next_check.get(id(allocator), 0.0):
                    continue
                next_check[id(allocator)] = now + _check_every_s(allocator)
                try:
                    ended.update(await loop.run_in_executor(None, allocator.check))
                except Exception as e:  # squeue failing for a while: the heartbeats still watch every host
                    print(f"monarch_nb hub: could not ask the {allocator.kind} allocator about its hosts: {e}",
                          file=sys.stderr)
            if self._stop_requested.is_set():
                return  # our own shutdown ends the allocation
            for host_id, why in ended.items():
                host = self._registry.hosts.get(host_id)
                if host is None or host.cause == why:
                    continue
                if host.cause:  # failed on its agent's word; now the allocator says why
                    host.cause = why
                    self._registry.save()
                else:
                    await self._supervision.host_failed(host, why)

    async def agent_exiting(self, header, message):
        """An agent is stopping on a signal that did not come from this hub: fail its
        host (and procs) before replying."""
        host = self._registry.hosts.get(header[agent_ops.HOST_ID])
        if host is not None and not host.cause and not self._stop_requested.is_set():
            ended = await asyncio.get_running_loop().run_in_executor(None, self.owner(host.host_id).check)
            why = ended.get(host.host_id) or header.get("why", "its host agent is exiting")
            await self._supervision.host_failed(host, why)
        return {}  # the agent holds its procs' exit reports until this reply


def _check_every_s(allocator) -> float:
    """How often ``allocator`` is asked whether its allocation ended (seconds)."""
    return getattr(allocator, "check_every_s", ALLOCATION_POLL_S)
