"""Liveness: the hub and its host agents beat to each other, clients beat to the hub.

Every ``HEARTBEAT_S`` the hub tells each host agent it is alive (an agent whose hub
falls silent keeps its procs for a grace period, then stops them), fails the hosts
whose agent fell silent for ``HOST_TIMEOUT_S`` and forgets silent clients.

Silence is only counted over time this hub was itself listening: up to when it last
read everything in its inbox (a backlog is this hub's, not its peers'), and never
across a stall of this hub (stopped, suspended, event loop blocked), after which every
peer gets a fresh window to be heard.
"""

from __future__ import annotations

import sys
import time

from ..protocol import agent_ops, envelope
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

    async def agent_alive(self, header, message):
        host = self._registry.hosts.get(header[agent_ops.HOST_ID])
        if host is not None:
            host.last_seen = time.monotonic()
            host.heartbeats += 1
            host.dropped_frames = header.get("dropped", host.dropped_frames)
            if host.lost and not host.cause:  # declared lost for its silence, yet alive
                await self._supervision.host_back(host)

    async def beat(self, due: float, now: float) -> None:
        """One heartbeat, due at ``due`` and run at ``now`` (monotonic seconds)."""
        if now - due > STALL_S:
            self._stalled(now - due + HEARTBEAT_S, now)
        hosts = self._registry.hosts
        for host in [h for h in hosts.values() if not h.lost]:  # a lost one must speak first
            await self._net.send(host.address, {envelope.OP: agent_ops.HUB_ALIVE})
        heard_up_to = self._net.caught_up()
        for host in list(hosts.values()):
            if not host.lost and heard_up_to - host.last_seen > HOST_TIMEOUT_S:
                await self._supervision.host_lost(host, heard_up_to - host.last_seen)
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
