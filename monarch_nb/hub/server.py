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
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import psutil

from .. import cluster_dir
from ..allocators import base as allocators
from ..mesh import Extent
from ..wire.aio import AioEndpoint
from . import health, state
from .logstore import LogStore
from .errors import HubError
from .registry import ActorMeshRecord, ClientRecord, HostRecord, ProcMeshRecord, ProcRecord, exit_cause
from .supervision import LOST_EXIT_CODE, SupervisionOps
from .allocation import AllocationOps
from .debug_ops import DebugOps

HEARTBEAT_S = 0.5
ADOPT_TIMEOUT_S = 3.0  # how long a recovering hub waits for each host agent to answer
CLIENT_TIMEOUT_S = 3.0  # a client silent this long is no longer counted as connected
HOST_TIMEOUT_S = 3.0  # a host agent silent this long (it beats every 0.5 s) is lost, with its procs
FLUSH_TIMEOUT_S = 2.0
STATUS_TIMEOUT_S = 1.0  # a proc whose control loop does not answer within this is "unresponsive"  # how long a log flush waits for each host agent
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


class Hub(SupervisionOps, AllocationOps, DebugOps):
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
        self.spawning: dict[str, list] = {}  # proc mesh being spawned -> [procs up, spawn id]
        self.spawning_size: dict[str, int] = {}  # proc mesh being spawned -> procs asked for
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
        heartbeat = asyncio.ensure_future(self._heartbeat())
        asyncio.ensure_future(self._watch_allocation())
        await self.stop_requested.wait()
        heartbeat.cancel()
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
            exited.update(reply.header["exited"])
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

    # logs ------------------------------------------------------------------------------
    async def _log_lines(self, header) -> None:
        """Store a batch from a host agent and pass each line on to the client whose call
        caused it (origin ``CLIENT_ID:...``); lines nobody's call caused go to every client."""
        records = self.logs.add(header["host_id"], header["lines"])
        by_client: dict[str, list] = {}
        for record in records:
            origin = record[7]
            owner = origin.partition(":")[0] if origin else None
            if owner in self.clients and self.clients[owner].wants_lines:
                targets = [owner]
            else:
                targets = [c for c, r in self.clients.items() if r.wants_lines]
            for client_id in targets:
                by_client.setdefault(client_id, []).append(record)
        for client_id, batch in by_client.items():
            client = self.clients[client_id]
            if client.log_address:
                client.log_seq += 1
                await self.net.send(client.log_address, {"op": "log_lines", "cluster": self.info["cluster_id"],
                                                         "seq": client.log_seq, "records": batch})

    async def op_logs_flush(self, header, message):
        """Every line written by any proc before this request has been forwarded when the
        reply comes; it says how many batches this client has been sent."""
        await asyncio.gather(*(self.net.request(h.address, {"op": "drain_logs"}, timeout=FLUSH_TIMEOUT_S)
                               for h in self.hosts.values()), return_exceptions=True)
        client = self.clients.get(header.get("client_id"))
        return {"seq": client.log_seq if client else 0}

    async def op_logs_query(self, header, message):
        try:
            records = self.logs.query(header.get("mesh"), header.get("ranks"), header.get("stream"),
                                      header.get("since"), header.get("grep"), header.get("tail"),
                                      header.get("after_seq", 0))
        except re.error as e:
            raise HubError(f"bad grep pattern {header.get('grep')!r}: {e}", "ValueError") from None
        return {"records": records, "last_seq": self.logs.seq}

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
        starting = {name: (up, self.spawning_size.get(name, 0)) for name, (up, _) in self.spawning.items()}
        return health.tree(self.info["name"], [self.hosts[h] for h in self.host_order if h in self.hosts],
                           self.proc_meshes, self.actor_meshes, LOST_EXIT_CODE, statuses, starting)

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

    async def op_spawn_procs(self, header, message):
        try:
            per_host = Extent(header["per_host"])
        except ValueError as e:
            raise HubError(f"bad per_host: {e}", "ValueError") from None
        if "hosts" in per_host:
            raise HubError("per_host must not name the 'hosts' dimension; the host mesh provides it",
                           "ValueError")
        hosts = header.get("hosts") or self.host_order
        extent = {"hosts": len(hosts), **per_host}
        name = header.get("name")
        if name is None:
            self._mesh_counter += 1
            name = f"procs{self._mesh_counter}"
        existing = self.proc_meshes.get(name)
        if existing is not None:
            if header.get("replace"):
                await self._stop_proc_mesh(existing)
            elif existing.extent == extent:
                return existing.public()
            else:
                raise HubError(f"a proc mesh named {name!r} exists with extent {existing.extent}, not "
                               f"{extent}; choose another name, or pass replace=True to stop it first",
                               "ValueError")
        per = per_host.nelements
        requests = []
        for h, host_id in enumerate(hosts):
            ids = [f"{name}/{h * per + i}" for i in range(per)]
            requests.append(self.net.request(self.hosts[host_id].address, {
                "op": "spawn_procs", "proc_ids": ids, "env": header.get("env", {}),
                "cwd": header.get("cwd"), "python": header.get("python")}))
        self.spawning[name] = [0, header.get("spawn_id")]
        self.spawning_size[name] = len(hosts) * per
        self._health_changed()
        try:
            replies = await asyncio.gather(*requests)
        finally:
            self.spawning.pop(name, None)
            self.spawning_size.pop(name, None)
        errors = [r.header["error"] for r in replies if not r.header["ok"]]
        procs = [ProcRecord(**p) for r in replies if r.header["ok"] for p in r.header["procs"]]
        if errors:
            await self._stop_procs(procs)
            raise HubError("; ".join(errors))
        record = self.proc_meshes[name] = ProcMeshRecord(
            name, extent, procs, owner=header.get("owner"),
            launch={k: header.get(k) for k in ("env", "cwd", "python")})
        self._save()
        return record.public()

    async def op_spawn_actors(self, header, message):
        name = header["name"]
        mesh = self.proc_meshes.get(header["proc_mesh"])
        if mesh is None:
            raise HubError(f"no proc mesh named {header['proc_mesh']!r}; it was stopped", "ValueError")
        existing = self.actor_meshes.get(name)
        if existing is not None:
            same = (existing.proc_mesh == mesh.name and existing.proc_ranks == header["proc_ranks"]
                    and existing.class_name == header["class_name"])
            if header.get("replace"):
                await self._stop_actor_mesh(existing)
            elif same:
                return self._actor_mesh_view(existing)
            else:
                raise HubError(f"an actor mesh named {name!r} exists ({existing.class_name} on "
                               f"{existing.proc_mesh} {existing.extent}); choose another name, or pass "
                               "replace=True to stop it first", "ValueError")
        dead = [mesh.procs[r].proc_id for r in header["proc_ranks"] if mesh.procs[r].exit_code is not None]
        if dead:
            raise HubError(f"procs {', '.join(dead)} of {mesh.name!r} have exited; spawn a new proc mesh")
        body = bytes(message.body)
        buffers = [bytes(b) for b in message.buffers]
        self._mesh_counter += 1
        payload_id = f"a{self._mesh_counter}"
        replies = await asyncio.gather(*(
            self.net.request(mesh.procs[r].address, {"op": "spawn_actor", "mesh": name, "rank": i,
                                                       "extent": header["extent"], "o": header.get("o"),
                                                       "main_thread": header.get("main_thread", False),
                                                       "owner": header.get("owner"), **self.debug_spawn_fields()},
                             body, buffers)
            for i, r in enumerate(header["proc_ranks"])))
        addresses = [r.header["address"] for r in replies]
        failures = {r.header["rank"]: bytes(r.body) for r in replies if not r.header["ok"]}
        record = ActorMeshRecord(name, mesh.name, header["proc_ranks"], header["extent"], header["class_name"],
                                 header["endpoints"], header.get("methods", []), addresses, payload_id,
                                 owner=header.get("owner"))
        if failures:
            await self._stop_actor_mesh(record)
            return {"failures": failures}
        self.actor_meshes[name] = record
        self.payloads[payload_id] = [body, *buffers]
        if not self.ephemeral:
            state.save_payload(self.path, payload_id, [body, *buffers])
        self._save()
        return self._actor_mesh_view(record)

    async def op_stop_actors(self, header, message):
        record = self.actor_meshes.get(header["name"])
        if record is not None:
            await self._stop_actor_mesh(record)
        return {}

    async def op_stop_procs(self, header, message):
        record = self.proc_meshes.get(header["name"])
        if record is not None:
            await self._stop_proc_mesh(record)
        return {}

    # helpers ---------------------------------------------------------------------------
    def _actor_mesh_view(self, record: ActorMeshRecord) -> dict:
        """What clients are told of an actor mesh: the record, and ``dead`` (rank -> why)
        for ranks whose proc is gone, so that calls to them fail at once."""
        mesh = self.proc_meshes.get(record.proc_mesh)
        dead = {}
        for i, r in enumerate(record.proc_ranks):
            proc = mesh.procs[r] if mesh is not None and r < len(mesh.procs) else None
            if proc is None:
                dead[str(i)] = "its proc mesh was stopped"
            elif proc.exit_code is not None:
                dead[str(i)] = f"proc {proc.proc_id} (pid {proc.pid}) {exit_cause(proc.exit_code)}"
        return {**record.public(), "dead": dead}

    async def _stop_actor_mesh(self, record: ActorMeshRecord) -> None:
        self._forget_actor_mesh(record)
        mesh = self.proc_meshes.get(record.proc_mesh)
        if mesh is None:
            return
        live = [mesh.procs[r] for r in record.proc_ranks if mesh.procs[r].exit_code is None]
        await asyncio.gather(*(
            self.net.request(p.address, {"op": "stop_actor", "mesh": record.name}, timeout=5.0)
            for p in live), return_exceptions=True)

    async def _stop_proc_mesh(self, record: ProcMeshRecord) -> None:
        for rank, proc in enumerate(record.procs):  # calls still waiting on its actors fail
            if proc.exit_code is None:
                await self._proc_died(record, rank, proc, expected=True)
        for actor_mesh in [a for a in self.actor_meshes.values() if a.proc_mesh == record.name]:
            self._forget_actor_mesh(actor_mesh)
        self.proc_meshes.pop(record.name, None)
        self._save()
        await self._stop_procs(record.procs)

    def _forget_actor_mesh(self, record: ActorMeshRecord) -> None:
        if self.actor_meshes.get(record.name) is record:
            del self.actor_meshes[record.name]
            self.payloads.pop(record.payload_id, None)
            state.drop_payload(self.path, record.payload_id)
            self._save()

    async def _stop_procs(self, procs: list[ProcRecord]) -> None:
        by_host: dict[str, list[str]] = {}
        for p in procs:
            by_host.setdefault(p.host_id, []).append(p.proc_id)
        await asyncio.gather(*(
            self.net.request(self.hosts[h].address, {"op": "stop_procs", "proc_ids": ids}, timeout=10.0)
            for h, ids in by_host.items() if h in self.hosts), return_exceptions=True)
