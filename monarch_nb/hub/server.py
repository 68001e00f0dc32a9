"""The hub daemon: control plane of one cluster.

It starts (or, recovering, re-adopts) host agents through an allocator, keeps the
registry of proc and actor meshes and its state file, carries out control requests
(spawn, stop, shutdown) from clients, counts the clients, stores every line the procs
print and forwards each to the client whose call caused it, and tells clients when a
proc dies or a host is lost. It never sees endpoint calls: those go straight from
client to actor.

Requests and replies are signed messages (see ``wire.frames``); a request header
has ``op`` (see ``protocol.hub_ops``), ``port`` and ``reply``; the reply has ``ok``
and either the result fields or ``error`` (message) and ``error_type``
(``ValueError``, ``ClusterError``). User payloads (actor classes and arguments) pass
through as opaque bytes.

The work is done by services, each built here with only what it needs (see the map in
``hub/__init__.py``); this module holds the lifecycle, the receive loop, the heartbeat
loop and the op table, which says which service answers each op.
"""

from __future__ import annotations

import asyncio
import os
import select
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable

import psutil

from .. import cluster_dir, notices
from ..allocators import base as allocators
from ..protocol import agent_ops, envelope, events, hub_ops
from ..wire import frames as wire_frames
from ..wire import zap
from ..wire.aio import AioEndpoint
from . import logstore, state
from .added_allocations import AddedAllocations
from .allocation import Allocation
from .announce import Announcer
from .clients import Clients
from .debug_ops import DebugRegistry
from .errors import HubError
from .health import Health
from .health_feed import HealthFeed
from .heartbeats import HEARTBEAT_S, Heartbeats
from .launcher import ProcLauncher
from .log_ops import LogOps
from .logstore import LogStore
from .mesh_ops import MeshOps
from .registry import Registry
from .restarts import Restarts
from .supervision import Supervision

MALFORMED_LOGGED = 10  # hub.log names the first this many messages no handler could act on

# An op's handler: (request header, message) -> the reply's result fields, or None for
# no reply (a one-way message). It raises ``HubError`` to fail the request.
Handler = Callable[[dict, wire_frames.Message], Awaitable[dict | None]]


class Hub:
    """One cluster's hub. ``ephemeral``: lives and dies with the client that started
    it; otherwise retained (runs until stopped, or until no client has been connected
    for ``idle_timeout`` seconds). ``recover``: re-adopt the host agents and meshes of
    the state file instead of starting new host agents.

    Construct it inside the event loop that runs it (it makes asyncio objects)."""

    def __init__(self, path: Path, info: dict, hosts: int, ephemeral: bool, grace_s: float,
                 idle_timeout: float | None = None, recover: bool = False, allocator: dict | None = None):
        self.path = path
        self.info = info
        self.n_hosts = hosts
        self.ephemeral = ephemeral
        self.grace_s = grace_s
        self.idle_timeout = idle_timeout
        self.saved = state.load(path) if recover else None
        if recover and self.saved is None:
            raise HubError(f"nothing to recover: {path / state.STATE_FILE} does not exist")
        # The allocator (a recovering hub's: the saved one, e.g. the same Slurm job) names
        # the interface everything of this hub binds on.
        self.allocator = allocators.create(self.saved.get("allocator") if self.saved else allocator,
                                           str(path), grace_s)
        if self.allocator.bind_address():
            os.environ["MONARCH_NB_BIND"] = self.allocator.bind_address()
        # A recovered hub takes its predecessor's address when it can, so that handles
        # held by clients keep working (that of a recovering hub that died before it was
        # ready counts: LAST_HUB).
        self.last_address = (info.get("hub") or info.get(cluster_dir.LAST_HUB)) if recover else None
        self.net = net = AioEndpoint(info["cluster_id"], prefer=self.last_address)
        self.hub_started = time.time()
        self.stop_requested = asyncio.Event()
        self._shutdown_request: dict | None = None  # answered once everything has stopped
        self.malformed = 0  # verified messages no handler could act on (dropped, or answered with an error)

        # The services, each given what it uses and nothing else.
        self.clients = Clients(net)
        self.announcer = Announcer(net, info["cluster_id"], self.clients)
        self.registry = registry = Registry(path, ephemeral, self.allocator, self.announcer, self.saved)
        self.logs = LogOps(LogStore(path), registry, self.clients, net, info["cluster_id"])
        self.debug = DebugRegistry(registry, net, self.announcer, recovered=self.saved is not None)
        launcher = ProcLauncher(registry, net)
        self.meshes = MeshOps(registry, net, self.announcer, launcher, self.debug)
        self.clients.on_joined = self._tell_what_died
        # Set once a recovering hub has adopted its predecessor's agents and meshes (at
        # once otherwise): what a client joining before then is told waits for it.
        self.adopted = asyncio.Event()
        self.supervision = Supervision(registry, net, self.announcer, self.logs.store, self.meshes,
                                       says_handled=not ephemeral)
        self.meshes.actor_died = self.supervision.actor_died
        self.restarts = Restarts(registry, net, launcher, self.supervision, self.meshes, self.debug)
        self.allocation = Allocation(self.allocator, hosts, path, registry, net, self.supervision, self.meshes,
                                     self.stop_requested)
        self.added_allocations = AddedAllocations(path, grace_s, registry, net, self.allocation,
                                                  self.meshes, self.stop_requested)
        self.heartbeats = Heartbeats(net, registry, self.clients, self.supervision)
        self.health = Health(info["name"], registry, net, self.meshes, self._stats)
        # The health tree kept from heartbeats and pushed: the registry's changes and an
        # actor's activity changing start a round; so does a subscriber's due refresh.
        self.health_feed = HealthFeed(self.health, net, self.clients, info["cluster_id"])
        self.heartbeats.on_statuses = self.health.heard
        launcher.on_statuses = self.health.started  # what new procs said as they started
        self.meshes.on_statuses = self.health.constructed  # what procs said as their new actors were made
        self.debug.on_proc_changed = self.health.stale  # a pause or resume: ask that proc again
        self.heartbeats.want_statuses = self.health.wanted
        self.health.on_activity = self.health_feed.changed
        self.announcer.health_listeners.append(self.health_feed.changed)
        self.ops = self._op_table()

    def _op_table(self) -> dict[str, Handler]:
        """Every op this hub answers, and the service that answers it."""
        return {
            # from host agents
            hub_ops.AGENT_READY: self.allocation.agent_ready,
            hub_ops.AGENT_ALIVE: self.heartbeats.agent_alive,
            hub_ops.AGENT_EXITING: self.allocation.agent_exiting,
            hub_ops.PROC_UP: self.meshes.proc_up,
            hub_ops.PROC_EXITED: self.supervision.proc_exited,
            hub_ops.LOG_LINES: self.logs.log_lines,  # run in arrival order by the receive loop
            # from procs
            hub_ops.ACTOR_FAILED: self.supervision.actor_failed,
            hub_ops.DEBUG_STOPPED: self.debug.debug_stopped,
            hub_ops.DEBUG_RESUMED: self.debug.debug_resumed,
            # from clients
            hub_ops.CLIENT_ALIVE: self.clients.client_alive,
            hub_ops.CLIENT_BYE: self.clients.client_bye,
            hub_ops.INFO: self.describe,
            hub_ops.HEALTH: self.health.health,
            hub_ops.HEALTH_SUBSCRIBE: self.health_feed.subscribe,
            hub_ops.HEALTH_UNSUBSCRIBE: self.health_feed.unsubscribe,
            hub_ops.SHUTDOWN: self.shutdown,
            hub_ops.ALLOCATE: self.added_allocations.allocate,
            hub_ops.RELEASE: self.added_allocations.release,
            hub_ops.SPAWN_PROCS: self.meshes.spawn_procs,
            hub_ops.SPAWN_PROGRESS: self.meshes.spawn_progress,
            hub_ops.SPAWN_ACTORS: self.meshes.spawn_actors,
            hub_ops.STOP_ACTORS: self.meshes.stop_actors,
            hub_ops.STOP_PROCS: self.meshes.stop_procs,
            hub_ops.RESTART_PROCS: self.restarts.restart_procs,
            hub_ops.SET_RANK_ENV: self.restarts.set_rank_env,
            hub_ops.LOGS_FLUSH: self.logs.logs_flush,
            hub_ops.LOGS_QUERY: self.logs.logs_query,
            hub_ops.DEBUG_PAUSED: self.debug.debug_paused,
            hub_ops.DEBUG_SET_BREAKPOINT: self.debug.debug_set_breakpoint,
            hub_ops.DEBUG_BREAKPOINTS: self.debug.debug_breakpoints,
            hub_ops.DEBUG_CLEAR_BREAKPOINTS: self.debug.debug_clear_breakpoints,
            hub_ops.DEBUG_POST_MORTEM: self.debug.debug_post_mortem,
            hub_ops.DEBUG_RELAY_REFUSED: self.debug.debug_relay_refused,
        }

    async def _tell_what_died(self, client) -> None:
        """A client that joins hears which actors are gone already: their deaths were
        told only to the clients of the time, and a call to an actor whose proc is gone
        gets no answer (an actor handed a mesh, calling it for the first time, waited
        for good)."""
        # A client's presence may join a recovering hub while it still adopts (it binds,
        # and serves, first): the deaths adoption finds must be in what it is told.
        await self.adopted.wait()
        gone = self.meshes.dead_actors()
        if gone:
            await self.announcer.tell(client, {envelope.OP: events.ACTORS_GONE, "actors": gone})

    # lifecycle ---------------------------------------------------------------------
    async def run(self, ready_fd: int | None) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_requested.set)
        serve = asyncio.ensure_future(self._serve())
        # Who this hub is, before it has hosts: a start can be stopped (`monarch-nb cluster
        # stop`), and its process told from a stale one, while hosts are still coming up.
        identity = {"hub_pid": os.getpid(), "hub_create_time": psutil.Process().create_time(),
                    "hostname": socket.gethostname()}
        # A recovering hub keeps its predecessor's address there: should it die before it
        # is ready, the next recover takes that address again.
        starting = {k: v for k, v in self.info.items() if k not in ("hub", cluster_dir.LAST_HUB)}
        if self.last_address:
            starting[cluster_dir.LAST_HUB] = self.last_address
        cluster_dir.write_json(self.path / "cluster.json", {**starting, **identity})
        if self.saved is not None:
            self.added_allocations.restore(self.saved)
            await self.allocation.adopt(self.saved)
            await self.added_allocations.end_unfinished()
        self.adopted.set()
        if not await self.allocation.acquire_hosts(lambda: ready_fd is not None and _reader_gone(ready_fd)):
            await self._shutdown_hosts()
            self.net.close()
            return  # the directory stays for the starting client to read hub.log
        self.registry.save()
        self.public_info = {
            **{k: v for k, v in self.info.items() if k != cluster_dir.LAST_HUB}, "hub": self.net.address, **identity,
            "ephemeral": self.ephemeral, "started": self.registry.started, "hosts": self.n_hosts,
            "grace_s": self.grace_s, "idle_timeout": self.idle_timeout, "allocator": self.allocator.spec(),
            "bind": os.environ.get("MONARCH_NB_BIND", "127.0.0.1")}
        cluster_dir.write_json(self.path / "cluster.json", self.public_info)
        self.clients.opened(time.monotonic())
        if ready_fd is not None:
            try:
                os.write(ready_fd, b"ready\n")
            except BrokenPipeError:  # the starting client is gone (Ctrl-C): don't linger
                print("monarch_nb hub: the client that started this cluster went away; stopping",
                      file=sys.stderr)
                self.stop_requested.set()
            os.close(ready_fd)
        background = [asyncio.ensure_future(self._heartbeat()), asyncio.ensure_future(self.allocation.watch()),
                      asyncio.ensure_future(self.health_feed.run())]
        await self.stop_requested.wait()
        for task in background:
            task.cancel()
        # What the clients that still hold handles are told of every proc as it goes.
        for proc in self.registry.live_procs():
            proc.cause = proc.cause or (f"was stopped with its cluster {self.path.name!r}: start or connect to a "
                                        "cluster and spawn again")
        await self._shutdown_hosts()
        serve.cancel()
        # Everything has stopped: nothing is left to recover, so no runtime file stays;
        # a retained cluster's lines stay readable (`monarch-nb logs NAME`).
        self.logs.store.close()
        self.registry.close()  # nothing may be written into the directory once it is removed
        if not self.ephemeral:
            logstore.keep(self.path / "logs" / logstore.DB_FILE, cluster_dir.kept_logs_path(self.path.name))
        shutil.rmtree(self.path, ignore_errors=True)
        if self._shutdown_request is not None:
            await self.net.reply(self._shutdown_request, ok=True)
            await asyncio.sleep(0)
        self.net.close()

    async def _shutdown_hosts(self) -> None:
        # Lost hosts are not told: a message queued for a dead agent would hold this
        # hub's exit for the sockets' linger time; the allocator stops what is left.
        await asyncio.gather(*(self.net.send(h.address, {envelope.OP: agent_ops.SHUTDOWN})
                               for h in self.registry.hosts.values() if not h.lost), return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self.allocation.stop, 5.0)
        # They have all exited: a heartbeat still queued for one, or an event for a proc
        # that was a client too (an actor that called another mesh), must not hold this
        # hub's exit for the sockets' linger time (it held a stop ~2 s).
        for address in [h.address for h in self.registry.hosts.values()] + [
                p.address for m in self.registry.proc_meshes.values() for p in m.procs] + [
                c.log_address for c in self.clients.table.values() if not c.wants_lines and c.log_address]:
            self.net.forget(address)

    async def _heartbeat(self) -> None:
        """Every ``HEARTBEAT_S``: a heartbeat of the host agents and clients (see
        ``heartbeats``); stop when idle for ``idle_timeout`` or when nobody could find
        this hub again."""
        due = time.monotonic()
        while True:
            try:
                await self._beat(due)
            except Exception as e:  # a bug must not end liveness (agents would stop every proc)
                print(f"monarch_nb hub: heartbeat failed: {type(e).__name__}: {e}", file=sys.stderr)
            due = time.monotonic() + HEARTBEAT_S
            await asyncio.sleep(HEARTBEAT_S)

    async def _beat(self, due: float) -> None:
        now = time.monotonic()
        await self.heartbeats.beat(due, now)
        if self.idle_timeout is not None and self.clients.idle_for(now) > self.idle_timeout:
            print(f"monarch_nb hub: no client for {self.idle_timeout} s; stopping the cluster", file=sys.stderr)
            self.stop_requested.set()
        self._check_cluster_file()

    def _check_cluster_file(self) -> None:
        """Clients find this hub through cluster.json: rewrite it if it was damaged, and
        stop if the cluster's directory was removed (nobody could find this hub again)."""
        target = self.path / "cluster.json"
        if not self.path.is_dir():
            print(f"monarch_nb hub: {self.path} was removed; stopping the cluster", file=sys.stderr)
            self.stop_requested.set()
            return
        try:
            if cluster_dir.read_info(self.path) == self.public_info:
                return
        except (OSError, ValueError):
            pass
        print(f"monarch_nb hub: {target} was changed or damaged; writing it again", file=sys.stderr)
        try:
            cluster_dir.write_json(target, self.public_info)
        except OSError as e:  # a full disk: tried again at the next heartbeat
            print(f"monarch_nb hub: could not write {target}: {e}", file=sys.stderr)

    async def _serve(self) -> None:
        """The receive loop. Nothing a message holds may end it: a message no handler
        can act on (a field missing) gets an error reply if it asked for one, or is
        dropped, and either way is counted (``malformed``, and ``frames.dropped``)."""
        while True:
            message = await self.net.recv()
            try:
                if self.net.deliver_reply(message):
                    pass
                elif message.header.get(envelope.OP) == hub_ops.LOG_LINES:  # in arrival order, before later replies
                    await self.ops[hub_ops.LOG_LINES](message.header, message)
                else:
                    asyncio.ensure_future(self._handle(message))
            except Exception as e:
                await self._malformed(message.header, e)
            # A flood of messages must not starve the heartbeats: a message that is
            # already queued is received without yielding to the event loop.
            await asyncio.sleep(0)

    async def _handle(self, message) -> None:
        header = message.header
        op = header.get(envelope.OP)
        if op is None:
            return  # a reply that came after its request gave up
        handler = self.ops.get(op) if isinstance(op, str) else None
        try:
            if handler is None:
                raise HubError(f"unknown hub operation {op!r}")
            result = await handler(header, message)
        except HubError as e:
            await self._reply(header, ok=False, error=str(e), error_type=e.error_type)
        except Exception as e:  # a field missing, or a bug in the hub: report it rather than hang the client
            await self._malformed(header, e)
        else:
            if result is not None:
                await self._reply(header, ok=True, **result)

    async def _malformed(self, header: dict, error: Exception) -> None:
        """A verified message this hub could not act on (a field missing or of the
        wrong type, or a bug): count it, say so in hub.log (the first few), and answer
        with the error if it asked for a reply."""
        self.malformed += 1
        wire_frames.count_dropped()
        op = header.get(envelope.OP)
        # The answer first: the caller waits for it, whatever becomes of the notice.
        await self._reply(header, ok=False, error=f"hub failed on {op}: {type(error).__name__}: {error}",
                          error_type="ClusterError")
        if self.malformed <= MALFORMED_LOGGED:
            print(f"monarch_nb hub: failed on a {op!r} message: {type(error).__name__}: {error} "
                  f"({self.malformed} so far)", file=sys.stderr)

    async def _reply(self, header: dict, **fields) -> None:
        """``net.reply`` that never raises: a reply that can't be sent (a bad reply
        address, a result that can't be pickled) is reported in hub.log."""
        try:
            await self.net.reply(header, **fields)
        except Exception as e:
            print(f"monarch_nb hub: could not reply to {header.get(envelope.OP)!r}: {type(e).__name__}: {e}",
                  file=sys.stderr)
            if fields.get(envelope.OK):  # tell the caller at least that it failed
                await self._reply(header, ok=False, error=f"hub could not send its reply: {type(e).__name__}: {e}",
                                  error_type="ClusterError")

    # the hub's own ops -------------------------------------------------------------------
    async def describe(self, header, message):
        """``info``: the cluster's configuration, hosts, clients, meshes and this hub's
        counters; with ``hub_ops.INFO_OF``, only the meshes it names."""
        registry = self.registry
        actor_meshes, proc_meshes = registry.actor_meshes, registry.proc_meshes
        of = header.get(hub_ops.INFO_OF)
        if of is not None and not isinstance(of, dict):
            raise HubError(f"info's {hub_ops.INFO_OF!r} must be a dict of 'proc_meshes' and 'actor_meshes' "
                           f"lists, not {type(of).__name__}", "ValueError")
        if of is not None:  # what a client asks of its own meshes: O(those), not O(the cluster)
            actor_meshes = {k: actor_meshes[k] for k in of.get("actor_meshes", ()) if k in actor_meshes}
            names = {*of.get("proc_meshes", ()), *(m.proc_mesh for m in actor_meshes.values())}
            proc_meshes = {n: proc_meshes[n] for n in names if n in proc_meshes}
        return {"name": self.info["name"], "started": registry.started, "hub_started": self.hub_started,
                "hub_pid": os.getpid(), "ephemeral": self.ephemeral, "grace_s": self.grace_s,
                "idle_timeout": self.idle_timeout, "allocator": self.allocator.spec(),
                "hosts": [registry.hosts[h].public() for h in registry.host_order],
                "allocations": {name: {"allocator": a.spec(), "hosts": [registry.hosts[h].public()
                                                                        for h in a.host_ids if h in registry.hosts]}
                                for name, a in registry.allocations.items()},
                "hub_stats": self._stats(),
                "clients": [c.public() for c in self.clients.table.values()],
                "proc_meshes": {n: m.public() for n, m in proc_meshes.items()},
                "actor_meshes": {n: self.meshes.actor_mesh_view(m) for n, m in actor_meshes.items()}}

    def _stats(self) -> dict:
        """Counters of this hub's own health: frame sets dropped (bad signature, replay,
        malformed), connections refused at the handshake (``wire.zap``), its stalls, its
        open sending sockets, the log store's state and the notices hub.log could not
        take (a full disk, see ``notices``)."""
        return {"dropped_frames": wire_frames.dropped(), "refused_connections": zap.refused(),
                "malformed": self.malformed,
                "stalls": self.heartbeats.stalls, "sockets": self.net.open_sockets(),
                "relay_refused": self.debug.state.relay_refused,
                "log_store": self.logs.store.writing(),
                "notices_lost": sys.stderr.lost if isinstance(sys.stderr, notices.NeverRaising) else 0}

    async def shutdown(self, header, message):
        """Stop everything; the reply goes out once all has stopped (see ``run``)."""
        self._shutdown_request = header
        self.stop_requested.set()


def _reader_gone(write_fd: int) -> bool:
    """Whether every reading end of the pipe ``write_fd`` writes to is closed: the
    client that started this hub, waiting on it for "ready", gave up or died."""
    poller = select.poll()
    poller.register(write_fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))
