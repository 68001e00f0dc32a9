"""Liveness: the hub and its host agents beat to each other, clients beat to the hub.

Every ``HEARTBEAT_S`` the hub tells each host agent it is alive (an agent whose hub
falls silent keeps its procs for a grace period, then stops them), fails the hosts
whose agent fell silent for ``HOST_TIMEOUT_S`` and forgets silent clients.

Silence is only counted over time this hub was itself listening: up to when it last
read everything in its inbox (a backlog is this hub's, not its peers'), and never
across a stall of this hub (stopped, suspended, event loop blocked), after which every
peer gets a fresh window to be heard.

Nor is it counted over time a host agent on this hub's machine spent waiting for a CPU
(``monarch_nb.starvation``): an agent silent past ``HOST_TIMEOUT_S`` that waited for a
CPU for its excess silence is starved, not lost. A stopped (SIGSTOP), hung or dead
agent does not wait for a CPU, and is lost as before; one on another machine is taken
back when heard again (``Supervision.host_back``). Each ``HUB_ALIVE`` names this hub's
pid and machine, so that an agent on it excuses this hub's waits the same way.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Callable

from ..protocol import agent_ops, envelope, hub_ops
from ..wire.aio import AioEndpoint
from .clients import Clients
from .registry import Registry
from .supervision import Supervision

HEARTBEAT_S = 0.5
HOST_TIMEOUT_S = 3.0  # a host agent silent this long (it beats every 0.5 s) is lost, with its procs
# A heartbeat this much later than due means the hub itself was stopped (SIGSTOP, a
# suspended laptop) or its event loop blocked: nobody's silence is counted across it.
STALL_S = 1.0


class Heartbeats:
    """Watches the host agents of ``registry`` (a silent one is lost, through
    ``supervision``) and the clients of ``clients``."""

    def __init__(self, net: AioEndpoint, registry: Registry, clients: Clients, supervision: Supervision):
        self._net = net
        self._registry = registry
        self._clients = clients
        self._supervision = supervision
        self.stalls = 0  # times this hub found its own event loop stalled
        self._hostname = socket.gethostname()
        self._pid = os.getpid()  # told to the agents: one on this machine excuses this hub's waits for a CPU
        self._starving: set[str] = set()  # hosts whose silence is excused now (said once per episode)
        # Given the procs' statuses a heartbeat brings, and when it came (hub.health.Health.heard).
        self.on_statuses: Callable[[dict, float], None] | None = None
        # Does anyone watch health now (hub.health.Health.wanted): told to the agents.
        self.want_statuses: Callable[[], bool] = lambda: False

    async def agent_alive(self, header, message):
        host = self._registry.hosts.get(header[agent_ops.HOST_ID])
        if host is not None:
            host.last_seen = time.monotonic()
            host.heartbeats += 1
            host.cpu.heard(host.pid if host.hostname == self._hostname else None)
            self._starving.discard(host.host_id)
            host.dropped_frames = header.get("dropped", host.dropped_frames)
            if host.lost and not host.cause:  # declared lost for its silence, yet alive
                await self._supervision.host_back(host)
            statuses = header.get(hub_ops.AGENT_STATUSES)
            if statuses and self.on_statuses is not None and not host.lost:
                self.on_statuses(statuses, host.last_seen)

    async def beat(self, due: float, now: float) -> None:
        """One heartbeat, due at ``due`` and run at ``now`` (monotonic seconds)."""
        if now - due > STALL_S:
            self._stalled(now - due + HEARTBEAT_S, now)
        hosts = self._registry.hosts
        alive = {envelope.OP: agent_ops.HUB_ALIVE, agent_ops.WANT_STATUSES: self.want_statuses(),
                 agent_ops.HUB_PID: self._pid, agent_ops.HUB_HOSTNAME: self._hostname,
                 agent_ops.ROUTERS_LOST: [h.router for h in hosts.values() if h.lost and h.router]}
        for host in [h for h in hosts.values() if not h.lost]:  # a lost one must speak first
            await self._net.send(host.address, dict(alive))
        heard_up_to = self._net.caught_up()
        for host in list(hosts.values()):
            silent = heard_up_to - host.last_seen
            if not host.lost and silent > HOST_TIMEOUT_S:
                counted = host.cpu.counted(silent)
                if counted > HOST_TIMEOUT_S:
                    await self._supervision.host_lost(host, silent)
                elif host.host_id not in self._starving:
                    self._starving.add(host.host_id)
                    host.starved += 1
                    print(f"monarch_nb hub: host agent {host.host_id} (pid {host.pid}) silent for {silent:.1f} s, "
                          f"{silent - counted:.1f} s of it waiting for a CPU: this machine is starved, the host is not lost",
                          file=sys.stderr)
        self._clients.expire(heard_up_to)

    def _stalled(self, stall_s: float, now: float) -> None:
        """This hub did not run for ``stall_s`` seconds: its peers were not silent, it
        was deaf. Give every host agent and client a fresh window to be heard."""
        self.stalls += 1
        print(f"monarch_nb hub: this hub was stalled for {stall_s:.1f} s (stopped, suspended or blocked); "
              f"host agents and clients get a fresh {HOST_TIMEOUT_S:.0f} s to be heard", file=sys.stderr)
        for host in self._registry.hosts.values():
            host.last_seen = max(host.last_seen, now)
        self._clients.heard_at(now)
