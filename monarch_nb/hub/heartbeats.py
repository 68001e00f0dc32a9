"""Liveness: the hub and its host agents beat to each other, clients beat to the hub.

Every ``HEARTBEAT_S`` the hub tells each host agent it is alive (an agent whose hub
falls silent keeps its procs for a grace period, then stops them), fails the hosts
whose agent fell silent for ``HOST_TIMEOUT_S`` and forgets silent clients.

Silence is only counted over time this hub was itself listening: up to when it last
read everything in its inbox (a backlog is this hub's, not its peers'), and never
across a stall of this hub (stopped, suspended, event loop blocked), after which every
peer gets a fresh window to be heard.

Nor is it counted over time a host agent on this hub's machine spent waiting for a CPU:
a machine starved of CPU (a load average of 18 on 2 cores) delays every process on it,
and its agents' heartbeats most of all, but loses no host. Linux tells how long a task
was runnable without running (``/proc/PID/schedstat``, once the wait ends) and whether
it is runnable now (``/proc/PID/stat``): an agent silent past ``HOST_TIMEOUT_S`` that
waited for a CPU for its excess silence is starved, not lost. A stopped (SIGSTOP),
hung or dead agent does not wait for a CPU, and is lost as before;
one on another machine is taken back when heard again (``Supervision.host_back``).
"""

from __future__ import annotations

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


def sched_times(pid: int) -> tuple[float, float, bool] | None:
    """Of the main thread of process ``pid`` of this machine (Linux): seconds it has run
    on a CPU, seconds it waited runnable for one (a wait counts once it ends), and
    whether it is runnable now (running or waiting); ``None`` where unknown."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            ran, waited = f.read().split()[:2]
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
        return int(ran) / 1e9, int(waited) / 1e9, state == "R"
    except (OSError, ValueError, IndexError):
        return None


def cpu_wait(silent_s: float, then: tuple[float, float], now: tuple[float, float, bool]) -> float:
    """How much of ``silent_s`` seconds of silence an agent spent waiting for a CPU,
    from its ``sched_times`` when last heard (``then``) and ``now``: the waits that
    ended meanwhile, or, while it is runnable, all of it that it did not run."""
    ran, waited = now[0] - then[0], now[1] - then[1]
    return max(waited, silent_s - ran) if now[2] else waited


def counted_silence(silent_s: float, waited_s: float) -> float:
    """The part of an agent's ``silent_s`` seconds of silence that counts towards its
    loss: what it did not spend waiting for a CPU (``waited_s`` of it)."""
    return silent_s - max(0.0, waited_s)


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
            if host.hostname == self._hostname:
                times = sched_times(host.pid)
                host.sched_at_seen = times[:2] if times is not None else None
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
        alive = {envelope.OP: agent_ops.HUB_ALIVE, agent_ops.WANT_STATUSES: self.want_statuses()}
        for host in [h for h in hosts.values() if not h.lost]:  # a lost one must speak first
            await self._net.send(host.address, dict(alive))
        heard_up_to = self._net.caught_up()
        for host in list(hosts.values()):
            silent = heard_up_to - host.last_seen
            if not host.lost and silent > HOST_TIMEOUT_S:
                waited = self._cpu_wait(host, silent)
                if counted_silence(silent, waited) > HOST_TIMEOUT_S:
                    await self._supervision.host_lost(host, silent)
                elif host.host_id not in self._starving:
                    self._starving.add(host.host_id)
                    host.starved += 1
                    print(f"monarch_nb hub: host agent {host.host_id} (pid {host.pid}) silent for {silent:.1f} s, "
                          f"{waited:.1f} s of it waiting for a CPU: this machine is starved, the host is not lost",
                          file=sys.stderr)
        self._clients.expire(heard_up_to)

    def _cpu_wait(self, host, silent_s: float) -> float:
        """Seconds of its ``silent_s`` of silence the agent of ``host`` (on this machine)
        spent waiting for a CPU; 0 when unknown (another machine, or no schedstat)."""
        now = sched_times(host.pid) if host.sched_at_seen is not None else None
        return 0.0 if now is None else cpu_wait(silent_s, host.sched_at_seen, now)

    def _stalled(self, stall_s: float, now: float) -> None:
        """This hub did not run for ``stall_s`` seconds: its peers were not silent, it
        was deaf. Give every host agent and client a fresh window to be heard."""
        self.stalls += 1
        print(f"monarch_nb hub: this hub was stalled for {stall_s:.1f} s (stopped, suspended or blocked); "
              f"host agents and clients get a fresh {HOST_TIMEOUT_S:.0f} s to be heard", file=sys.stderr)
        for host in self._registry.hosts.values():
            host.last_seen = max(host.last_seen, now)
        self._clients.heard_at(now)
