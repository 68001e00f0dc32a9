"""The health tree of a cluster, as data: cluster -> hosts -> procs -> actors, and the
same actors per actor mesh.

States, worst first:

- proc: ``failed`` (exited or killed, with its ``cause``), ``lost`` (its host agent
  fell silent), ``unresponsive`` (alive but its control loop did not answer),
  ``paused`` (an actor stopped in the debugger), ``busy`` (an actor runs an
  endpoint), ``healthy`` (running, idle); a mesh still being spawned is ``starting``.
- actor: ``failed`` / ``lost`` with its proc, ``paused`` (with file, line), ``busy``
  (with ``endpoint`` and ``busy_s``), ``healthy``.
- host: ``healthy``, ``lost`` (its agent fell silent) or ``failed`` (its allocation
  ended, e.g. a cancelled Slurm job; ``cause`` says how); ``node`` is the
  allocator's name for it (a Slurm node); ``gpus`` its GPU inventory.
- proc: ``gpus``, the GPUs of its host it is bound to (``spawn_procs`` of a ``"gpus"``
  dimension; index, id, name and total memory when known), ``[]`` when unbound; and
  ``gpu_used_bytes`` (GPU id -> bytes) when the memory it uses there is known (NVML on
  its host, or torch in a proc where CUDA is up; ``hub.gpu_binding.in_use``).

Memory, CPU time and uptime of each proc come from the proc itself (psutil), so they
are known on every host. Each host agent asks its procs for their ``status`` and folds
the answers into its heartbeat (``host.status_poll``); ``Health`` keeps the latest of
each proc and answers the ``health`` op from them; a status older than
``STATUS_FRESH_S`` is asked for again, of the proc's host agent (``ask_statuses``), or of
the proc itself where the agent can't answer (a proc that then does not answer within
``STATUS_TIMEOUT_S`` is ``unresponsive``). It builds the tree with :func:`tree`;
``hub.health_feed`` pushes its changes to subscribers.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from ..protocol import agent_ops, envelope, hub_ops, proc_ops, services
from ..protocol import gpus as gpus_proto
from ..protocol.states import AT_WORK, DOWN, PROC_ORDER, STATE, Activity, HealthState
from ..protocol.records import LOST_EXIT_CODE, exit_cause
from ..wire.aio import AioEndpoint
from .gpu_binding import gpus_of, in_use
from .mesh_ops import MeshOps
from .records import ActorMeshRecord, HostRecord, ProcMeshRecord, ProcRecord
from .registry import Registry

STATUS_TIMEOUT_S = 1.0  # a proc whose control loop does not answer within this is "unresponsive"
# A status heard through a heartbeat is used while younger than this; an agent asks every
# second (host.status_poll.POLL_S), so only a proc that stopped answering its agent, or
# an agent that stopped beating, is asked again by the hub.
STATUS_FRESH_S = 2.5
# A status a proc sent with its answer to an actor spawn is used for this long: what the
# new actors do is known, idle, as they are made, and a call made right after shows busy
# within it, as a heartbeat's status (polled each second, used for STATUS_FRESH_S) would.
CONSTRUCTED_FRESH_S = 2.0
# Host agents ask their procs only while someone watches: for this long after a
# health(), and while a subscriber is open (hub.health_feed keeps it wanted).
WANTED_AFTER_HEALTH_S = 30.0
EXIT_CHECK_S = 0.02  # while waiting for status replies, how often procs reported exited are let go
AGENT_ANSWER_MARGIN_S = 0.5  # an agent answers ASK_STATUSES within STATUS_TIMEOUT_S, plus its own delays


def _actor_node(record: ActorMeshRecord, rank: int, proc_state: str, status: dict | None, now: float) -> dict:
    node = {"mesh": record.name, "rank": rank, "class": record.class_name}
    if proc_state in DOWN:
        return {**node, STATE: proc_state}
    died = record.died.get(str(rank))
    if died is not None:  # dead while its proc lives: it answers every call with its failure
        return {**node, STATE: HealthState.FAILED, "died": died}
    doing = (status or {}).get("actors", {}).get(record.name, {})
    if doing.get(STATE) == Activity.PAUSED:
        extra = {k: v for k, v in doing.items() if k not in (STATE, "since")}
        return {**node, **extra, STATE: HealthState.PAUSED, "paused_s": round(now - doing["since"], 3)}
    if doing.get(STATE) == Activity.BUSY:
        return {**node, STATE: HealthState.BUSY, "endpoint": doing["endpoint"],
                "busy_s": round(now - doing["since"], 3)}
    return {**node, STATE: HealthState.HEALTHY}


def tree(name: str, hosts: list[HostRecord], proc_meshes: dict[str, ProcMeshRecord],
         actor_meshes: dict[str, ActorMeshRecord], statuses: dict[str, dict | None],
         starting: dict[str, tuple[int, int]]) -> dict:
    """The health tree.

    ``statuses``: proc id -> its answer to ``status`` (None: no answer); procs not in
    it are not asked (dead).
    ``starting``: proc mesh being spawned -> (procs up, procs asked for).
    """
    now = time.time()
    on_proc: dict[str, list[tuple[ActorMeshRecord, int]]] = {}
    for record in actor_meshes.values():
        mesh = proc_meshes.get(record.proc_mesh)
        for i, rank in enumerate(record.proc_ranks):
            if mesh is not None and rank < len(mesh.procs):
                on_proc.setdefault(mesh.procs[rank].proc_id, []).append((record, i))
    counts = dict.fromkeys(PROC_ORDER, 0)
    proc_state_of: dict[str, str] = {}
    actor_nodes: dict[str, dict[int, dict]] = {}
    host_nodes = []
    for host in hosts:
        procs = []
        for mesh in proc_meshes.values():
            for rank, proc in enumerate(mesh.procs):
                if proc.host_id != host.host_id:
                    continue
                status = statuses.get(proc.proc_id)
                cause = None
                if proc.exit_code == LOST_EXIT_CODE:
                    state, cause = HealthState.LOST, "lost with its host"
                elif proc.exit_code is not None:
                    state, cause = HealthState.FAILED, proc.cause or exit_cause(proc.exit_code)
                elif status is None:
                    state = HealthState.UNRESPONSIVE
                else:
                    state = HealthState.HEALTHY
                here = on_proc.get(proc.proc_id, [])
                actors = [_actor_node(r, i, state, status, now) for r, i in here]
                for (r, i), a in zip(here, actors):
                    actor_nodes.setdefault(r.key, {})[i] = a
                if state == HealthState.HEALTHY:  # a proc is as busy as its busiest actor
                    for s in AT_WORK:
                        if any(a[STATE] == s for a in actors):
                            state = s
                            break
                counts[state] += 1
                proc_state_of[proc.proc_id] = state
                gpus, gpu_used = in_use(gpus_of(host.gpus, mesh.rank_env.get(str(rank))), status)
                node = {"proc_id": proc.proc_id, "proc_mesh": mesh.name, "rank": rank, "pid": proc.pid,
                        STATE: state, "cause": cause, "actors": actors, "gpus": gpus}
                if status:
                    node.update({k: status[k] for k in ("rss_bytes", "cpu_s", "uptime_s") if k in status})
                if gpu_used:
                    node[gpus_proto.GPU_USED_BYTES] = gpu_used
                procs.append(node)
        host_nodes.append({"host_id": host.host_id, "hostname": host.hostname, "node": host.node, "pid": host.pid,
                           STATE: HealthState.FAILED if host.cause else HealthState.LOST if host.lost
                           else HealthState.HEALTHY,
                           "cause": host.cause or None, "dropped_frames": host.dropped_frames, "gpus": host.gpus,
                           "procs": procs})
    mesh_nodes = []
    died = 0  # actors dead while their procs live (the procs count healthy)
    for record in actor_meshes.values():
        nodes = [actor_nodes.get(record.key, {}).get(i) for i in range(len(record.proc_ranks))]
        died += sum(1 for n in nodes if n and n.get("died"))
        states = [n[STATE] if n else HealthState.LOST for n in nodes]
        bad = [s for s in states if s in DOWN]
        mesh_nodes.append({"name": record.name, "key": record.key, "class": record.class_name, "proc_mesh": record.proc_mesh,
                           "extent": record.extent, "alive": len(states) - len(bad), "size": len(states),
                           STATE: HealthState.FAILED if bad else next((s for s in AT_WORK if s in states),
                                                                      HealthState.HEALTHY),
                           "actors": [n for n in nodes if n]})
    total = sum(counts.values())
    # running: what the summary calls healthy
    alive = counts[HealthState.HEALTHY] + counts[HealthState.BUSY] + counts[HealthState.PAUSED]
    summary = f"{alive}/{total} procs healthy"
    for s in (HealthState.BUSY, HealthState.PAUSED, HealthState.UNRESPONSIVE):
        if counts[s]:
            summary += f" · {counts[s]} {s}"
    summary += f" · {counts[HealthState.FAILED] + counts[HealthState.LOST]} failed"
    hosts_down = sum(1 for h in host_nodes if h[STATE] != HealthState.HEALTHY)
    if hosts_down:
        summary += f" · {hosts_down}/{len(host_nodes)} host(s) {'failed' if any(h['cause'] for h in host_nodes) else 'lost'}"
    if died:
        summary += f" · {died} actor(s) dead"
    if starting:
        summary += " · " + ", ".join(f"{n} starting ({up}/{of})" for n, (up, of) in starting.items())
    healthy = alive == total and not hosts_down and not died
    return {"cluster": name, STATE: HealthState.HEALTHY if healthy else HealthState.DEGRADED,
            "summary": summary,
            "counts": {**{s.value: n for s, n in counts.items()}, "alive": alive}, "hosts": host_nodes,
            "actor_meshes": mesh_nodes,
            "services": service_nodes(proc_meshes, proc_state_of),
            "starting": [{"proc_mesh": n, "up": up, "total": of, STATE: HealthState.STARTING}
                         for n, (up, of) in starting.items()]}


def service_nodes(proc_meshes: dict[str, ProcMeshRecord], proc_state_of: dict[str, str]) -> list[dict]:
    """The services among ``proc_meshes`` (``protocol.services``), each with its
    replicas' newest proc meshes: ``{"name", "key", "class", "replicas": [{"replica",
    "proc_mesh", "state", "pids", "cause"}]}``. A replica is as bad as its worst proc
    (``PROC_ORDER``); one with no proc mesh now is ``stopped``. Load
    (requests, calls in flight) is known to the client that routes, which adds it."""
    found = services.group({name: mesh.public() for name, mesh in proc_meshes.items() if mesh.service})
    nodes = []
    for name, record in found.items():
        replicas: list[dict] = []
        for idx in range(record[services.REPLICAS]):
            mesh = proc_meshes.get(record["replica_meshes"].get(idx, ""))
            if mesh is None:
                replicas.append({"replica": idx, "proc_mesh": None, STATE: HealthState.STOPPED, "pids": [],
                                 "cause": "no procs now (stopped, or between a failure and its replacement)"})
                continue
            states = [proc_state_of.get(p.proc_id, HealthState.FAILED if p.exit_code is not None
                                        else HealthState.STARTING) for p in mesh.procs]
            state = next((s for s in PROC_ORDER if s in states), HealthState.HEALTHY)
            cause = next((p.cause or exit_cause(p.exit_code) for p in mesh.procs if p.exit_code is not None), None)
            replicas.append({"replica": idx, "proc_mesh": mesh.name, STATE: state, "cause": cause,
                             "pids": [p.pid for p in mesh.procs]})
        nodes.append({"name": name, "key": record[services.KEY], "class": record[services.CLASS],
                      "replicas": replicas})
    return nodes


def _doing(status: dict | None) -> dict | None:
    """What the actors of a proc's ``status`` are doing, without the figures that change
    on their own (memory, CPU, uptime): a change here is worth telling subscribers now."""
    return None if status is None else status.get("actors") or {}


class Health:
    """Answers ``health`` for the cluster ``name``: the meshes of ``registry`` (those
    being spawned from ``meshes``), from the statuses the host agents' heartbeats carry
    (``heard``), asking for a live proc's status only when it is stale; ``hub_stats``
    gives the hub's own counters. ``on_activity`` (if set) is called when a heard status
    says an actor's activity changed (busy, paused, idle)."""

    def __init__(self, name: str, registry: Registry, net: AioEndpoint, meshes: MeshOps,
                 hub_stats: Callable[[], dict]):
        self._name = name
        self._registry = registry
        self._net = net
        self._meshes = meshes
        self._hub_stats = hub_stats
        # proc id -> (monotonic when it answered, its status, the address that answered)
        self._heard: dict[str, tuple[float, dict, str]] = {}
        # Procs whose latest status is the one they sent as they started (``started``): used
        # only while no actor is on them, since it can't say what an actor is doing.
        self._from_start: set[str] = set()
        self.probes = 0  # status requests this hub sent to procs itself (stale or never heard)
        self.agent_asks = 0  # ASK_STATUSES this hub sent to host agents (statuses stale or never heard)
        self.on_activity: Callable[[], None] | None = None
        self._wanted_until = 0.0  # monotonic: until then, agents are told to ask their procs

    def want(self, for_s: float) -> None:
        """Have the host agents fold their procs' statuses into their heartbeats for the
        next ``for_s`` seconds (at least)."""
        self._wanted_until = max(self._wanted_until, time.monotonic() + for_s)

    def wanted(self) -> bool:
        """Should the agents ask their procs now (``agent_ops.WANT_STATUSES``)?"""
        return time.monotonic() < self._wanted_until

    def heard(self, statuses: dict, now: float) -> None:
        """A host agent's heartbeat brought ``statuses`` (``hub_ops.AGENT_STATUSES``: proc
        id -> [age in seconds, status, the address asked]: a restarted proc keeps its id,
        not its address; status ``None``: the proc did not answer its agent within
        ``STATUS_TIMEOUT_S``, so it is unresponsive) at ``now`` (monotonic)."""
        changed = False
        self._from_start.difference_update(statuses)
        for proc_id, (age_s, status, address) in statuses.items():
            before = self._heard.get(proc_id)
            self._heard[proc_id] = (now - age_s, status, address)
            changed = changed or before is None or _doing(before[1]) != _doing(status)
        if changed and self.on_activity is not None:
            self.on_activity()

    def started(self, statuses: dict, now: float) -> None:
        """New procs' statuses as they started (``agent_ops.PROC_STATUS``, passed on in the
        agents' answers to a spawn; as ``heard`` takes them): a ``health()`` right after
        ``spawn_procs`` then asks nobody. Once actors are spawned on such a proc, its
        status is asked for again (what the actors do can only come from the proc)."""
        self.heard(statuses, now)
        self._from_start.update(statuses)

    def constructed(self, statuses: dict, now: float) -> None:
        """Statuses procs sent with their answers to an actor spawn (as ``heard`` takes
        them), used for ``CONSTRUCTED_FRESH_S``: a ``health()`` right after the spawn
        asks none of them again."""
        self.heard({proc_id: [age_s + STATUS_FRESH_S - CONSTRUCTED_FRESH_S, status, address]
                    for proc_id, (age_s, status, address) in statuses.items()}, now)

    def stale(self, proc_id: str) -> None:
        """What proc ``proc_id`` does changed in a way the hub heard of (a thread paused in
        the debugger, or ran on): its status is asked for again at the next ``health()``."""
        self._heard.pop(proc_id, None)

    async def health(self, header, message):
        """The health tree (see ``tree``), from the statuses heartbeats brought; a live
        proc whose status is older than ``STATUS_FRESH_S`` is asked for, in parallel with
        the others (``_ask_hosts``), waiting at most ``STATUS_TIMEOUT_S`` for the procs.
        The agents keep statuses fresh for ``WANTED_AFTER_HEALTH_S`` after it: the first
        health() after a quiet spell asks for every proc's, those that follow for none."""
        self.want(WANTED_AFTER_HEALTH_S)
        return await self.build()

    async def build(self) -> dict:
        """The health tree with the hub's counters (``hub``), as ``health`` answers it."""
        registry = self._registry
        live = registry.live_procs()
        statuses = await self.statuses(live)
        hosts = [registry.hosts[h] for h in registry.all_host_ids() if h in registry.hosts]
        found = tree(self._name, hosts, registry.proc_meshes, registry.actor_meshes, statuses,
                     self._meshes.starting())
        stats = {**self._hub_stats(), "status_probes": self.probes, "status_asks": self.agent_asks}
        if stats.get("relay_refused"):  # another user tried a debugger relay: the owner should know
            found["summary"] += f" · {stats['relay_refused']} debugger connection(s) refused"
        return {**found, "hub": stats}

    async def statuses(self, live: list[ProcRecord]) -> dict[str, dict | None]:
        """Each live proc's status by proc id: the one its agent's heartbeat brought while
        younger than ``STATUS_FRESH_S`` (``None`` when the proc did not answer its agent),
        else a fresh one (``None``: none in time; see ``_ask_hosts``)."""
        now = time.monotonic()
        found: dict[str, dict | None] = {}
        stale = []
        with_actors = self._registry.procs_with_actors() if self._from_start else set()
        for proc in live:
            heard = self._heard.get(proc.proc_id)
            if heard is not None and now - heard[0] <= STATUS_FRESH_S and heard[2] == proc.address and not (
                    proc.proc_id in with_actors and proc.proc_id in self._from_start):
                found[proc.proc_id] = heard[1]
            else:
                stale.append(proc)
        if len(self._heard) > 2 * len(live):  # procs gone: forget them (amortized, not per event)
            alive = {p.proc_id for p in live}
            self._heard = {k: v for k, v in self._heard.items() if k in alive}
            self._from_start &= alive
        if stale:
            asked = await self._ask_hosts(stale)
            answered = time.monotonic()
            for proc in stale:
                status = asked.get(proc.proc_id)
                if status is not None:
                    self._heard[proc.proc_id] = (answered, status, proc.address)
                    self._from_start.discard(proc.proc_id)
            found.update(asked)
        return found

    async def _ask_hosts(self, stale: list[ProcRecord]) -> dict[str, dict | None]:
        """Fresh statuses of ``stale`` procs, by proc id: one ``ASK_STATUSES`` to each
        host agent for its own procs (so this loop sends a message per host, not per
        proc, and the hosts ask theirs in parallel); the procs an agent did not answer
        for (an older agent, one that failed, a proc it does not know) are asked by
        this hub itself. A proc reported exited meanwhile is left out."""
        by_host: dict[str, list[ProcRecord]] = {}
        for proc in stale:
            by_host.setdefault(proc.host_id, []).append(proc)
        hosts = self._registry.hosts
        requests = {host_id: asyncio.ensure_future(self._net.request(
                        hosts[host_id].address,
                        {envelope.OP: agent_ops.ASK_STATUSES, agent_ops.PROC_IDS: [p.proc_id for p in procs]},
                        timeout=STATUS_TIMEOUT_S + AGENT_ANSWER_MARGIN_S))
                    for host_id, procs in by_host.items()
                    if host_id in hosts and not hosts[host_id].lost and hosts[host_id].address}
        self.agent_asks += len(requests)
        pending = set(requests.values())
        while pending:
            _, pending = await asyncio.wait(pending, timeout=EXIT_CHECK_S)
            for host_id, request in requests.items():
                if not request.done() and all(p.exit_code is not None for p in by_host[host_id]):
                    request.cancel()
                    pending.discard(request)
        found: dict[str, dict | None] = {}
        for host_id, request in requests.items():
            if request.done() and not request.cancelled() and request.exception() is None \
                    and request.result().header.get(envelope.OK):
                for proc_id, (_, status, _) in (request.result().header.get(hub_ops.AGENT_STATUSES) or {}).items():
                    found[proc_id] = status
        unanswered = [p for p in stale if p.proc_id not in found and p.exit_code is None]
        if unanswered:
            self.probes += len(unanswered)
            found.update(await self._statuses(unanswered))
        return {p.proc_id: found[p.proc_id] for p in stale if p.proc_id in found and p.exit_code is None}

    async def _statuses(self, live: list[ProcRecord]) -> dict[str, dict | None]:
        """Each live proc's answer to ``status`` by proc id; ``None`` if it did not answer
        in time. A proc whose exit is reported meanwhile is not waited for and left out.
        One timer for them all, not one per proc: at 256 procs that was 12,800 wake-ups
        a second on the hub's loop while it waited."""
        requests = [asyncio.ensure_future(self._net.request(p.address, {envelope.OP: proc_ops.STATUS},
                                                            timeout=STATUS_TIMEOUT_S)) for p in live]
        pending = set(requests)
        let_go: set[str] = set()
        while pending:
            _, pending = await asyncio.wait(pending, timeout=EXIT_CHECK_S)
            for proc, request in zip(live, requests):
                if proc.exit_code is not None and not request.done():
                    # cancel() only asks: the task is not done until it next runs, so it
                    # is left out by id rather than by its state.
                    request.cancel()
                    pending.discard(request)
                    let_go.add(proc.proc_id)
        return {p.proc_id: None if r.exception() is not None else r.result().header
                for p, r in zip(live, requests) if p.proc_id not in let_go}
