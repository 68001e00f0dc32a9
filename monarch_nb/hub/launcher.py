"""Starting and stopping procs through their host agents, all of a host's at once."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from .. import fd_limit
from ..protocol import agent_ops, envelope, hub_ops
from ..wire.aio import AioEndpoint
from .errors import HubError
from .records import ProcRecord
from .registry import Registry

SPAWN_TIMEOUT_S = 120.0  # an agent answers within its own 60 s proc start timeout, or is gone
STOP_TIMEOUT_S = 10.0  # how long stopping procs waits for each host agent
LOST_CHECK_S = 0.1  # while a spawn waits for its agents, how often hosts lost meanwhile are given up


class ProcLauncher:
    """Asks the host agents of ``registry`` to start and stop procs."""

    def __init__(self, registry: Registry, net: AioEndpoint):
        self._registry = registry
        self._net = net
        # Given the statuses the new procs reported as they started (as a heartbeat brings
        # them: hub_ops.AGENT_STATUSES) and when they came (monotonic); set by the hub.
        self.on_statuses: Callable[[dict, float], None] | None = None
        self._unanswered: set[asyncio.Future] = set()  # stop requests to silent hosts, not waited for

    async def start(self, ids_by_host: dict[str, list[str]], launch: dict,
                    env_by_proc: dict[str, dict] | None = None) -> list[ProcRecord]:
        """Have each host's agent start the procs ``ids_by_host[host]``, all at once;
        returns them in that order. If any host fails (or is silent for
        ``SPAWN_TIMEOUT_S``), the procs that did start are stopped and ``HubError`` says
        why; so does a hub that would run out of open files with them (before any starts)."""
        live = sum(p.exit_code is None for m in self._registry.proc_meshes.values() for p in m.procs)
        problem = fd_limit.spawn_problem("the hub", live, sum(len(ids) for ids in ids_by_host.values()))
        if problem:
            raise HubError(problem)
        hosts = list(ids_by_host)
        requests = [asyncio.ensure_future(self._net.request(self._registry.hosts[h].address, {
                        envelope.OP: agent_ops.SPAWN_PROCS, agent_ops.PROC_IDS: ids_by_host[h],
                        "env": launch.get("env") or {}, "cwd": launch.get("cwd"), "python": launch.get("python"),
                        "env_by_proc": {p: env_by_proc[p] for p in ids_by_host[h] if p in (env_by_proc or {})}},
                        timeout=SPAWN_TIMEOUT_S))
                    for h in hosts]
        lost = await self._wait_unless_lost(hosts, requests)
        errors, procs = [], []
        for host_id, request in zip(hosts, requests):
            if host_id in lost:
                errors.append(lost[host_id])
            elif request.exception() is not None:
                errors.append(f"host agent {host_id} did not answer within {SPAWN_TIMEOUT_S:.0f} s")
            elif not request.result().header[envelope.OK]:
                errors.append(request.result().header[envelope.ERROR])
            else:
                procs += [ProcRecord(**p) for p in request.result().header["procs"]]
                statuses = request.result().header.get(hub_ops.AGENT_STATUSES)
                if statuses and self.on_statuses is not None:
                    self.on_statuses(statuses, time.monotonic())
        if errors:
            await self.stop(procs)
            raise HubError("; ".join(errors))
        return procs

    async def _wait_unless_lost(self, hosts: list[str], requests: list) -> dict[str, str]:
        """Wait for every request (one per host of ``hosts``); one whose host is lost or
        failed meanwhile (its agent gone: no answer will come) is given up at once.
        Returns host id -> why, for those given up."""
        lost: dict[str, str] = {}
        pending = set(requests)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=LOST_CHECK_S)
            for host_id, request in zip(hosts, requests):
                record = self._registry.hosts.get(host_id)
                if request in pending and (record is None or record.lost):
                    request.cancel()
                    pending.discard(request)
                    lost[host_id] = (f"host {host_id} was lost while its procs started"
                                     + (f": {record.cause}" if record is not None and record.cause else ""))
        return lost

    async def stop(self, procs: list[ProcRecord]) -> None:
        """Have the host agents stop ``procs`` (those of hosts the registry still holds;
        none of a host that failed for good, its agent gone: asking it waited
        ``STOP_TIMEOUT_S`` for nothing, and so did the user's ``ProcMesh.stop()``).
        A host lost for its silence is asked without waiting for its answer."""
        hosts = {h: record for h, record in self._registry.hosts.items() if not (record.lost and record.cause)}
        by_host: dict[str, list[str]] = {}
        for p in procs:
            by_host.setdefault(p.host_id, []).append(p.proc_id)
        answers = []
        for h, ids in by_host.items():
            if h not in hosts:
                continue
            ask = self._net.request(hosts[h].address, {envelope.OP: agent_ops.STOP_PROCS, agent_ops.PROC_IDS: ids},
                                    timeout=STOP_TIMEOUT_S)
            if hosts[h].lost:
                # Silent (stopped, hung): the request waits in its queue and stops those
                # procs once the agent runs again; nobody waits for it (ProcMesh.stop()
                # waited STOP_TIMEOUT_S for that answer).
                unanswered = asyncio.ensure_future(ask)
                self._unanswered.add(unanswered)
                unanswered.add_done_callback(self._unanswered.discard)
                unanswered.add_done_callback(lambda f: f.cancelled() or f.exception())  # (retrieved: not logged)
            else:
                answers.append(ask)
        await asyncio.gather(*answers, return_exceptions=True)
