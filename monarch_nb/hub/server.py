"""The hub daemon: control plane of one cluster.

It starts (or, recovering, re-adopts) host agents through an allocator, keeps the
registry of proc and actor meshes and its state file, carries out control requests
(spawn, stop, shutdown) from clients, counts the clients, stores every line the procs
print and forwards each to the client whose call caused it, and tells clients when a
proc dies or a host is lost. It never sees endpoint calls: those go straight from
client to actor.

Requests and replies are signed messages (see ``wire.frames``); a request header
has ``op``, ``port`` and ``reply``; the reply has ``ok`` and either the result
fields or ``error`` (message) and ``error_type`` (``ValueError``, ``ClusterError``).
User payloads (actor classes and arguments) pass through as opaque bytes.

This module holds the lifecycle, heartbeats, events, clients and dispatch; the
operations live in mixins beside it: ``mesh_ops`` (spawn, stop), ``log_ops``,
``supervision`` (failures, restarts), ``allocation`` (hosts from the allocator) and
``debug_ops`` (the debugger's registry).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import psutil

from .. import cluster_dir
from ..allocators import base as allocators
from ..wire import frames as wire_frames
from ..wire.aio import AioEndpoint
from . import health, state
from .allocation import AllocationOps
from .debug_ops import DebugOps
from .errors import HubError
from .log_ops import LogOps
from .logstore import LogStore
from .mesh_ops import MeshOps
from .registry import LOST_EXIT_CODE, ActorMeshRecord, ClientRecord, HostRecord, ProcMeshRecord, ProcRecord
from .supervision import SupervisionOps

HEARTBEAT_S = 0.5
ADOPT_TIMEOUT_S = 3.0  # how long a recovering hub waits for each host agent to answer
CLIENT_TIMEOUT_S = 3.0  # a client silent this long is no longer counted as connected
HOST_TIMEOUT_S = 3.0  # a host agent silent this long (it beats every 0.5 s) is lost, with its procs
# A heartbeat this much later than due means the hub itself was stopped (SIGSTOP, a
# suspended laptop) or its event loop blocked: nobody's silence is counted across it.
STALL_S = 1.0
MALFORMED_LOGGED = 10  # hub.log names the first this many messages no handler could act on
STATUS_TIMEOUT_S = 1.0  # a proc whose control loop does not answer within this is "unresponsive"
EVENT_COALESCE_S = 0.1  # health_changed goes out at most this often


def _client_alive(client: ClientRecord) -> bool:
    """False once a client on this machine has exited (a kernel restart): it is then
    forgotten at once instead of after ``CLIENT_TIMEOUT_S``."""
    if client.hostname != socket.gethostname():
        return True
    try:
        return psutil.Process(client.pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Hub(MeshOps, LogOps, SupervisionOps, AllocationOps, DebugOps):
    """One cluster's hub. ``ephemeral``: lives and dies with the client that started
    it; otherwise retained (runs until stopped, or until no client has been connected
    for ``idle_timeout`` seconds). ``recover``: re-adopt the host agents and meshes of
    the state file instead of starting new host agents."""

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
        # A recovered hub takes its predecessor's address when it can, so that handles
        # held by clients keep working.
        # The allocator (a recovering hub's: the saved one, e.g. the same Slurm job) names
        # the interface everything of this hub binds on.
        self.allocator = allocators.create(self.saved.get("allocator") if self.saved else allocator,
                                           str(path), grace_s)
        if self.allocator.bind_address():
            os.environ["MONARCH_NB_BIND"] = self.allocator.bind_address()
        self.net = AioEndpoint(info["cluster_id"], prefer=info.get("hub") if recover else None)
        self.hosts: dict[str, HostRecord] = {}
        self.host_order: list[str] = []
        self.proc_meshes: dict[str, ProcMeshRecord] = {}
        self.actor_meshes: dict[str, ActorMeshRecord] = {}
        self.clients: dict[str, ClientRecord] = {}
        self.logs = LogStore(path)
        self.payloads: dict[str, list[bytes]] = {}  # actor mesh constructor frames, for restarts
        self.spawning: dict[str, list] = {}  # proc mesh being spawned -> [procs up, spawn id, procs asked for]
        self.spawning_actors: dict[str, list[ProcRecord]] = {}  # actor mesh being constructed -> its procs
        self.started = self.saved["started"] if self.saved else time.time()
        self.hub_started = time.time()
        self.idle_since = time.monotonic()
        self.stop_requested = asyncio.Event()
        self._all_hosts_ready = asyncio.Event()
        self._mesh_counter = self.saved["mesh_counter"] if self.saved else 0
        self._shutdown_request: dict | None = None  # answered once everything has stopped
        self._health_pending = False
        self._rejoining: set[str] = set()  # lost hosts being taken back (see supervision._host_back)
        self._state_failing = False  # the last state file write failed (said once in hub.log)
        self.stalls = 0  # times this hub found its own event loop stalled (see _heartbeat)
        self.malformed = 0  # verified messages no handler could act on (dropped, or answered with an error)

    # lifecycle ---------------------------------------------------------------------
    async def run(self, ready_fd: int | None) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_requested.set)
        serve = asyncio.ensure_future(self._serve())
        if self.saved is not None:
            await self._adopt(self.saved)
        if not await self._acquire_hosts():
            await self._shutdown_hosts()
            self.net.close()
            return  # the directory stays for the starting client to read hub.log
        self._save()
        self.public_info = {
            **self.info, "hub": self.net.address, "hub_pid": os.getpid(),
            "hub_create_time": psutil.Process().create_time(), "hostname": socket.gethostname(),
            "ephemeral": self.ephemeral, "started": self.started, "hosts": self.n_hosts, "grace_s": self.grace_s,
            "idle_timeout": self.idle_timeout, "allocator": self.allocator.spec(),
            "bind": os.environ.get("MONARCH_NB_BIND", "127.0.0.1")}
        cluster_dir.write_json(self.path / "cluster.json", self.public_info)
        if ready_fd is not None:
            try:
                os.write(ready_fd, b"ready\n")
            except BrokenPipeError:  # the starting client is gone (Ctrl-C): don't linger
                print("monarch_nb hub: the client that started this cluster went away; stopping",
                      file=sys.stderr)
                self.stop_requested.set()
            os.close(ready_fd)
        background = [asyncio.ensure_future(self._heartbeat()), asyncio.ensure_future(self._watch_allocation())]
        await self.stop_requested.wait()
        for task in background:
            task.cancel()
        await self._shutdown_hosts()
        serve.cancel()
        # Everything has stopped: nothing is left to recover, so no runtime file stays.
        self.logs.close()
        shutil.rmtree(self.path, ignore_errors=True)
        if self._shutdown_request is not None:
            await self.net.reply(self._shutdown_request, ok=True)
            await asyncio.sleep(0)
        self.net.close()

    async def _adopt(self, saved: dict) -> None:
        """Take over the host agents and meshes of a previous hub of this cluster.

        Agents that answer are told this hub's address and report which procs are still
        running; procs that exited meanwhile are marked so, and hosts that don't answer
        within ``ADOPT_TIMEOUT_S`` are dropped with their procs."""
        hosts: dict[str, HostRecord] = saved["hosts"]
        self.proc_meshes, self.actor_meshes = saved["proc_meshes"], saved["actor_meshes"]
        replies = await asyncio.gather(*(
            self.net.request(h.address, {"op": "adopt", "hub": self.net.address}, timeout=ADOPT_TIMEOUT_S)
            for h in hosts.values()), return_exceptions=True)
        exited: dict[str, int] = {}
        for host, reply in zip(hosts.values(), replies):
            if isinstance(reply, BaseException):
                print(f"monarch_nb hub: host agent {host.host_id} (pid {host.pid}) did not answer; "
                      "dropping its procs", file=sys.stderr)
                continue
            self.hosts[host.host_id] = host
            live = set(reply.header["procs"])
            exited.update({p: code for p, code in reply.header["exited"].items() if p not in live})
            for mesh in self.proc_meshes.values():
                for proc in mesh.procs:
                    if proc.host_id == host.host_id and proc.proc_id not in live:
                        exited.setdefault(proc.proc_id, LOST_EXIT_CODE)
        self.host_order = [h for h in saved["host_order"] if h in self.hosts]
        self.allocator.adopt({h.host_id: h.pid for h in self.hosts.values()})
        for mesh in self.proc_meshes.values():
            for proc in mesh.procs:
                if proc.host_id not in self.hosts:
                    exited.setdefault(proc.proc_id, LOST_EXIT_CODE)
                if proc.proc_id in exited and proc.exit_code is None:
                    proc.exit_code = exited[proc.proc_id]
        for mesh in list(self.proc_meshes.values()):
            if all(p.exit_code is not None for p in mesh.procs):
                print(f"monarch_nb hub: every proc of {mesh.name!r} is gone; forgetting it and its actors",
                      file=sys.stderr)
                for actors in [a for a in self.actor_meshes.values() if a.proc_mesh == mesh.name]:
                    self._forget_actor_mesh(actors)
                del self.proc_meshes[mesh.name]

    async def _shutdown_hosts(self) -> None:
        # Lost hosts are not told: a message queued for a dead agent would hold this
        # hub's exit for the sockets' linger time; the allocator stops what is left.
        await asyncio.gather(*(self.net.send(h.address, {"op": "shutdown"}) for h in self.hosts.values()
                               if not h.lost), return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self.allocator.stop, 5.0)
        # They have all exited: a heartbeat still queued for one must not hold this
        # hub's exit for the sockets' linger time.
        for address in [h.address for h in self.hosts.values()] + [
                p.address for m in self.proc_meshes.values() for p in m.procs]:
            self.net.forget(address)

    async def _heartbeat(self) -> None:
        """Every ``HEARTBEAT_S``: tell the host agents this hub is alive, fail hosts and
        forget clients that fell silent, and stop when idle for ``idle_timeout``.

        Silence is only counted over time this hub was itself listening: up to when it
        last read everything in its inbox (a backlog is this hub's, not its peers'), and
        never across a stall of this hub (stopped, suspended, event loop blocked), after
        which every peer gets a fresh window to be heard."""
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
        if now - due > STALL_S:
            self._stalled(now - due + HEARTBEAT_S, now)
        for host in [h for h in self.hosts.values() if not h.lost]:  # a lost one must speak first
            await self.net.send(host.address, {"op": "hub_alive"})
        heard_up_to = self.net.caught_up()
        for host in list(self.hosts.values()):
            if not host.lost and heard_up_to - host.last_seen > HOST_TIMEOUT_S:
                await self._host_lost(host, heard_up_to - host.last_seen)
        for client_id, client in list(self.clients.items()):
            if heard_up_to - client.last_seen > CLIENT_TIMEOUT_S or not _client_alive(client):
                del self.clients[client_id]
                if client.log_address:
                    self.net.forget(client.log_address)
                if not self.clients:
                    self.idle_since = client.last_seen
        if self.idle_timeout is not None and not self.clients and now - self.idle_since > self.idle_timeout:
            print(f"monarch_nb hub: no client for {self.idle_timeout} s; stopping the cluster", file=sys.stderr)
            self.stop_requested.set()
        self._check_cluster_file()

    def _stalled(self, stall_s: float, now: float) -> None:
        """This hub did not run for ``stall_s`` seconds: its peers were not silent, it
        was deaf. Give every host agent and client a fresh window to be heard."""
        self.stalls += 1
        print(f"monarch_nb hub: this hub was stalled for {stall_s:.1f} s (stopped, suspended or blocked); "
              f"host agents and clients get a fresh {HOST_TIMEOUT_S:.0f} s to be heard", file=sys.stderr)
        for peer in [*self.hosts.values(), *self.clients.values()]:
            peer.last_seen = max(peer.last_seen, now)
        if not self.clients:  # nor is the idle timeout counted across it
            self.idle_since = max(self.idle_since, now)

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

    def _save(self) -> None:
        """The registry changed: write the state file and tell clients (coalesced)."""
        self._health_changed()
        if self.ephemeral:
            return
        # On the event loop, not in a thread: a reply sent after this promises that a
        # recovering hub finds the change. A full disk only costs recoverability.
        try:
            state.save(self.path, self.started, self.hosts, self.host_order, self._mesh_counter,
                       self.proc_meshes, self.actor_meshes, allocator=self.allocator.spec())
        except OSError as e:
            if not self._state_failing:
                print(f"monarch_nb hub: could not write the state file ({e}); the cluster runs on, but a hub "
                      "recovered after this one dies may miss the latest changes", file=sys.stderr)
            self._state_failing = True
        else:
            if self._state_failing:
                print("monarch_nb hub: writing the state file again", file=sys.stderr)
            self._state_failing = False

    def _health_changed(self) -> None:
        """Announce ``health_changed`` once per ``EVENT_COALESCE_S``, however many changes."""
        if self._health_pending:
            return
        self._health_pending = True

        def announce():
            self._health_pending = False
            asyncio.ensure_future(self._announce({"op": "health_changed"}))

        asyncio.get_running_loop().call_later(EVENT_COALESCE_S, announce)

    async def _announce(self, event: dict) -> None:
        """Send ``event`` to every client's event inbox (its log receiver)."""
        event = {**event, "cluster": self.info["cluster_id"]}
        for client in list(self.clients.values()):
            if client.log_address:
                await self.net.send(client.log_address, event)

    async def _serve(self) -> None:
        """The receive loop. Nothing a message holds may end it: a message no handler
        can act on (a field missing) gets an error reply if it asked for one, or is
        dropped, and either way is counted (``malformed``, and ``frames.dropped``)."""
        while True:
            message = await self.net.recv()
            try:
                if self.net.deliver_reply(message):
                    pass
                elif message.header.get("op") == "log_lines":
                    await self._log_lines(message.header)  # in arrival order, before later replies
                else:
                    asyncio.ensure_future(self._handle(message))
            except Exception as e:
                await self._malformed(message.header, e)
            # A flood of messages must not starve the heartbeats: a message that is
            # already queued is received without yielding to the event loop.
            await asyncio.sleep(0)

    async def _handle(self, message) -> None:
        header = message.header
        op = header.get("op")
        if op is None:
            return  # a reply that came after its request gave up
        handler = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
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
        op = header.get("op")
        if self.malformed <= MALFORMED_LOGGED:
            print(f"monarch_nb hub: failed on a {op!r} message: {type(error).__name__}: {error} "
                  f"({self.malformed} so far)", file=sys.stderr)
        await self._reply(header, ok=False, error=f"hub failed on {op}: {type(error).__name__}: {error}",
                          error_type="ClusterError")

    async def _reply(self, header: dict, **fields) -> None:
        """``net.reply`` that never raises: a reply that can't be sent (a bad reply
        address, a result that can't be pickled) is reported in hub.log."""
        try:
            await self.net.reply(header, **fields)
        except Exception as e:
            print(f"monarch_nb hub: could not reply to {header.get('op')!r}: {type(e).__name__}: {e}",
                  file=sys.stderr)
            if fields.get("ok"):  # tell the caller at least that it failed
                await self._reply(header, ok=False, error=f"hub could not send its reply: {type(e).__name__}: {e}",
                                  error_type="ClusterError")

    # host agents ---------------------------------------------------------------------
    async def op_agent_ready(self, header, message):
        self.hosts[header["host_id"]] = HostRecord(header["host_id"], header["address"], header["pid"],
                                                   header["hostname"], node=header.get("node", ""))
        if self.host_order and all(h in self.hosts for h in self.host_order):
            self._all_hosts_ready.set()

    async def op_agent_alive(self, header, message):
        host = self.hosts.get(header["host_id"])
        if host is not None:
            host.last_seen = time.monotonic()
            host.heartbeats += 1
            host.dropped_frames = header.get("dropped", host.dropped_frames)
            if host.lost and not host.cause:  # declared lost for its silence, yet alive
                await self._host_back(host)

    async def op_proc_up(self, header, message):
        progress = self.spawning.get(header["proc_id"].rpartition("/")[0])
        if progress is not None:
            progress[0] += 1

    async def op_spawn_progress(self, header, message):
        """How many procs of the spawn ``spawn_id`` have started so far."""
        up = [p[0] for p in self.spawning.values() if p[1] == header["spawn_id"]]
        return {"up": up[0] if up else None}

    # clients ---------------------------------------------------------------------------
    async def op_client_alive(self, header, message):
        client = self.clients.get(header["client_id"])
        if client is None:
            client = self.clients[header["client_id"]] = ClientRecord(
                header["client_id"], header["pid"], header["hostname"], header["label"], header.get("logs"),
                wants_lines=header.get("lines", True))
        client.last_seen = time.monotonic()

    async def op_client_bye(self, header, message):
        client = self.clients.pop(header["client_id"], None)
        if client is not None:
            if client.log_address:
                self.net.forget(client.log_address)
            if not self.clients:
                self.idle_since = time.monotonic()

    # client requests -------------------------------------------------------------------
    async def op_info(self, header, message):
        return {"name": self.info["name"], "started": self.started, "hub_started": self.hub_started,
                "hub_pid": os.getpid(), "ephemeral": self.ephemeral, "grace_s": self.grace_s,
                "idle_timeout": self.idle_timeout, "allocator": self.allocator.spec(),
                "hosts": [self.hosts[h].public() for h in self.host_order],
                "hub_stats": self._stats(),
                "clients": [c.public() for c in self.clients.values()],
                "proc_meshes": {n: m.public() for n, m in self.proc_meshes.items()},
                "actor_meshes": {n: self._actor_mesh_view(m) for n, m in self.actor_meshes.items()}}

    def _stats(self) -> dict:
        """Counters of this hub's own health: frame sets dropped (bad signature, replay,
        malformed), its stalls, its open sending sockets and the log store's state."""
        return {"dropped_frames": wire_frames.dropped(), "malformed": self.malformed, "stalls": self.stalls,
                "sockets": self.net.open_sockets(), "log_store": self.logs.writing()}

    async def op_health(self, header, message):
        """The health tree (see ``health.tree``); every live proc is asked what its
        actors are doing, in parallel, waiting at most ``STATUS_TIMEOUT_S``."""
        live = [p for m in self.proc_meshes.values() for p in m.procs if p.exit_code is None]
        replies = await asyncio.gather(*(self._proc_status(p) for p in live))
        statuses = {p.proc_id: r for p, r in zip(live, replies) if r is not False}
        starting = {name: (up, size) for name, (up, _, size) in self.spawning.items()}
        return {**health.tree(self.info["name"], [self.hosts[h] for h in self.host_order if h in self.hosts],
                              self.proc_meshes, self.actor_meshes, statuses, starting),
                "hub": self._stats()}

    async def _proc_status(self, proc: ProcRecord) -> dict | None | bool:
        """The proc's answer to ``status``; ``None`` if it did not answer in time;
        ``False`` if its exit was reported meanwhile (a dead proc is not waited for)."""
        request = asyncio.ensure_future(self.net.request(proc.address, {"op": "status"}, timeout=STATUS_TIMEOUT_S))
        while not request.done():
            await asyncio.wait([request], timeout=0.02)
            if proc.exit_code is not None:
                request.cancel()
                return False
        return None if request.exception() is not None else request.result().header

    async def op_shutdown(self, header, message):
        self._shutdown_request = header
        self.stop_requested.set()
