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
        self.started = self.saved["started"] if self.saved else time.time()
        self.hub_started = time.time()
        self.idle_since = time.monotonic()
        self.stop_requested = asyncio.Event()
        self._all_hosts_ready = asyncio.Event()
        self._mesh_counter = self.saved["mesh_counter"] if self.saved else 0
        self._shutdown_request: dict | None = None  # answered once everything has stopped
        self._health_pending = False

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
        await asyncio.gather(*(self.net.send(h.address, {"op": "shutdown"}) for h in self.hosts.values()),
                             return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self.allocator.stop, 5.0)

    async def _heartbeat(self) -> None:
        while True:
            for host in list(self.hosts.values()):
                await self.net.send(host.address, {"op": "hub_alive"})
            now = time.monotonic()
            for host in list(self.hosts.values()):
                if not host.lost and now - host.last_seen > HOST_TIMEOUT_S:
                    await self._host_lost(host, now - host.last_seen)
            for client_id, client in list(self.clients.items()):
                if now - client.last_seen > CLIENT_TIMEOUT_S or not _client_alive(client):
                    del self.clients[client_id]
                    if not self.clients:
                        self.idle_since = client.last_seen
            if self.idle_timeout is not None and not self.clients and now - self.idle_since > self.idle_timeout:
                print(f"monarch_nb hub: no client for {self.idle_timeout} s; stopping the cluster", file=sys.stderr)
                self.stop_requested.set()
            self._check_cluster_file()
            await asyncio.sleep(HEARTBEAT_S)

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
        cluster_dir.write_json(target, self.public_info)

    def _save(self) -> None:
        """The registry changed: write the state file and tell clients (coalesced)."""
        self._health_changed()
        if not self.ephemeral:
            state.save(self.path, self.started, self.hosts, self.host_order, self._mesh_counter,
                       self.proc_meshes, self.actor_meshes, allocator=self.allocator.spec())

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
        while True:
            message = await self.net.recv()
            if self.net.deliver_reply(message):
                continue
            if message.header.get("op") == "log_lines":
                await self._log_lines(message.header)  # in arrival order, before later replies
                await asyncio.sleep(0)  # a flood of lines must not starve the heartbeats
                continue
            asyncio.ensure_future(self._handle(message))

    async def _handle(self, message) -> None:
        header = message.header
        op = header.get("op")
        if op is None:
            return  # a reply that came after its request gave up
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            await self.net.reply(header, ok=False, error=f"unknown hub operation {op!r}",
                                 error_type="ClusterError")
            return
        try:
            result = await handler(header, message)
        except HubError as e:
            await self.net.reply(header, ok=False, error=str(e), error_type=e.error_type)
        except Exception as e:  # a bug in the hub: report it rather than hang the client
            await self.net.reply(header, ok=False, error=f"hub failed on {op}: {type(e).__name__}: {e}",
                                 error_type="ClusterError")
        else:
            if result is not None:
                await self.net.reply(header, ok=True, **result)

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
        if self.clients.pop(header["client_id"], None) is not None and not self.clients:
            self.idle_since = time.monotonic()

    # client requests -------------------------------------------------------------------
    async def op_info(self, header, message):
        return {"name": self.info["name"], "started": self.started, "hub_started": self.hub_started,
                "hub_pid": os.getpid(), "ephemeral": self.ephemeral, "grace_s": self.grace_s,
                "idle_timeout": self.idle_timeout, "allocator": self.allocator.spec(),
                "hosts": [vars(self.hosts[h]) for h in self.host_order],
                "clients": [c.public() for c in self.clients.values()],
                "proc_meshes": {n: m.public() for n, m in self.proc_meshes.items()},
                "actor_meshes": {n: self._actor_mesh_view(m) for n, m in self.actor_meshes.items()}}

    async def op_health(self, header, message):
        """The health tree (see ``health.tree``); every live proc is asked what its
        actors are doing, in parallel, waiting at most ``STATUS_TIMEOUT_S``."""
        live = [p for m in self.proc_meshes.values() for p in m.procs if p.exit_code is None]
        replies = await asyncio.gather(*(self._proc_status(p) for p in live))
        statuses = {p.proc_id: r for p, r in zip(live, replies) if r is not False}
        starting = {name: (up, size) for name, (up, _, size) in self.spawning.items()}
        return health.tree(self.info["name"], [self.hosts[h] for h in self.host_order if h in self.hosts],
                           self.proc_meshes, self.actor_meshes, statuses, starting)

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
