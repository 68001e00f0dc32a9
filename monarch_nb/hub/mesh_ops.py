"""Proc meshes and actor meshes in the hub: spawn, stop and describe them.

Procs are started by the host agents (all at once, per host, see ``launcher``);
actors by their procs, from the constructor payload that passes through as opaque
bytes (also kept for restarts, see ``Registry.keep_payload``).

Stopping a mesh is also how supervision ends meshes whose owner is gone: meshes an
actor spawned are stopped when that actor is gone (its proc died or was stopped, or
its mesh was stopped): nobody is left to use them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Awaitable, Callable

from .. import cluster_dir
from ..mesh import Extent
from ..protocol import agent_ops, envelope, events, gpus, hub_ops, proc_ops, services
from ..protocol.records import exit_cause
from ..wire.aio import AioEndpoint
from .announce import Announcer
from .debug_ops import DebugRegistry
from . import gpu_binding
from .errors import HubError
from .launcher import ProcLauncher
from .records import ActorMeshRecord, ProcMeshRecord, ProcRecord, actor_mesh_key
from .registry import Registry

STOP_ACTOR_TIMEOUT_S = 5.0  # how long stopping an actor mesh waits for each of its procs


def check_mesh_name(name) -> None:
    """Raise ``HubError`` (a ``ValueError`` for the client) for a name that can't be a
    mesh's (it also makes proc ids ``NAME/RANK``)."""
    if not cluster_dir.is_valid_name(name):
        raise HubError(f"mesh name {name!r}: {cluster_dir.NAME_RULE}", "ValueError")


class MeshOps:
    """Spawns and stops the meshes of ``registry``: procs through ``launcher``, actors
    by asking their procs (with ``debug``'s configuration); clients hear of actors
    gone through ``announcer``."""

    def __init__(self, registry: Registry, net: AioEndpoint, announcer: Announcer, launcher: ProcLauncher,
                 debug: DebugRegistry):
        self._registry = registry
        self._net = net
        self._announcer = announcer
        self._launcher = launcher
        self._debug = debug
        self._spawning: dict[str, list] = {}  # proc mesh being spawned -> [procs up, spawn id, procs asked for]
        self._spawning_actors: dict[str, list[ProcRecord]] = {}  # actor mesh being constructed -> its procs
        self._abandoned: set[str] = set()  # actor meshes being constructed whose client gave up: not created
        self._claimed: dict[str, asyncio.Event] = {}  # proc mesh name or actor mesh key being spawned -> set when done
        # actor mesh being constructed -> resolved with why, once one of its procs is gone
        # (died, lost with its host, stopped): its answer would never come
        self._construct_lost: dict[str, asyncio.Future] = {}
        # Supervision's actor_died(record, rank, cause, endpoint, traceback), set by the hub
        # (supervision uses these ops): a spawned actor whose __init__ raised is a failure.
        self.actor_died: Callable[..., Awaitable[None]] | None = None
        # Actors of meshes a recovering hub forgot (every proc of theirs was gone): address ->
        # (mesh name, rank, report), told to each client that joins, as dead_actors are.
        self.forgotten: dict[str, tuple[str, int, str]] = {}
        # Given the statuses procs sent as their new actors were constructed (proc id ->
        # [age, status, address], as a heartbeat brings them) and when (monotonic); set by
        # the hub: a health() right after the spawn then asks none of them again.
        self.on_statuses: Callable[[dict, float], None] | None = None

    @contextlib.asynccontextmanager
    async def _one_spawn_at_a_time(self, key: str):
        """Spawns of one mesh (a proc mesh's name, an actor mesh's key) run one after
        another: a second spawn, sent while the first is constructing, then finds the first's
        mesh and returns it (spawn is idempotent) instead of making a second one. This is
        what makes ``get_or_spawn_controller`` from two clients at once yield one controller."""
        while (busy := self._claimed.get(key)) is not None:
            await busy.wait()
        done = self._claimed[key] = asyncio.Event()
        try:
            yield
        finally:
            del self._claimed[key]
            done.set()

    async def spawn_procs(self, header, message):
        try:
            per_host = Extent(header["per_host"])
            hub_ops.check_procs_per_host(dict(per_host), per_host.nelements)
        except ValueError as e:
            raise HubError(f"bad per_host: {e}", "ValueError") from None
        known = self._registry.hosts
        hosts = header.get("hosts") or self._registry.host_order
        host_extent = Extent(header[hub_ops.HOST_EXTENT])
        if host_extent.nelements != len(hosts):
            raise HubError(f"host mesh extent {dict(host_extent)} does not match its {len(hosts)} hosts", "ValueError")
        overlap = [label for label in per_host if label in host_extent]
        if overlap:
            raise HubError(f"per_host names {overlap}, which the host mesh {dict(host_extent)} already has; "
                           "per_host gives the dimensions of the procs on each host", "ValueError")
        gone = [h for h in hosts if h not in known or known[h].lost]
        if gone:
            causes = "; ".join(f"{h}: {known[h].cause or 'its agent fell silent'}" if h in known
                               else f"{h}: unknown" for h in gone)
            if all(h in known and not known[h].cause for h in gone):  # silent: they may be heard again
                raise HubError(f"can't start procs on lost host(s) ({causes}); a host whose agent is heard from "
                               "again is taken back with its procs: try again then, or spawn on other hosts")
            raise HubError(f"can't start procs on lost host(s) ({causes}); stop this cluster and start a new one")
        extent = {**host_extent, **per_host}
        name = header.get("name")
        bound = self._gpu_plan(header, dict(per_host), dict(host_extent), hosts, name)  # before any proc starts
        bound = _with_rank_env(bound, header.get(hub_ops.RANK_ENV), len(hosts) * per_host.nelements)
        if name is None:
            name = f"procs{self._registry.next_number()}"
        check_mesh_name(name)
        async with self._one_spawn_at_a_time(name):
            existing = self._registry.proc_meshes.get(name)
            if existing is not None:
                if header.get("replace"):
                    await self.stop_proc_mesh(existing)
                elif existing.extent == extent:
                    return existing.public()
                else:
                    raise HubError(f"a proc mesh named {name!r} exists with extent {existing.extent}, not "
                                   f"{extent}; choose another name, or pass replace=True to stop it first",
                                   "ValueError")
            per = per_host.nelements
            launch = {k: header.get(k) for k in ("env", "cwd", "python")}
            self._spawning[name] = [0, header.get("spawn_id"), len(hosts) * per]
            self._announcer.health_changed()
            ids = {host_id: [f"{name}/{h * per + i}" for i in range(per)] for h, host_id in enumerate(hosts)}
            try:
                procs = await self._launcher.start(ids, launch, {f"{name}/{r}": env for r, env in enumerate(bound)})
            finally:
                self._spawning.pop(name, None)
            record = self._registry.proc_meshes[name] = ProcMeshRecord(name, extent, procs, owner=header.get("owner"),
                                                                       launch=launch,
                                                                       service=header.get(services.SERVICE))
            record.rank_env.update({str(r): dict(env) for r, env in enumerate(bound)})  # restarts set them again
            await self._registry.save(record)  # on disk before the reply: a recovered hub has it
            return record.public()

    def _gpu_plan(self, header: dict, per_host: dict, host_extent: dict, hosts: list[str],
                  name: str | None) -> list[dict]:
        """Each new proc's GPU binding and torch elastic variables (``gpu_binding.plan``),
        in rank order, from the GPUs no live proc of another mesh than ``name`` holds;
        ``HubError`` (a ``ValueError`` for the client) when a host has too few."""
        registry = self._registry
        try:
            per_proc = gpu_binding.parse_gpus_per_proc(header.get(gpus.GPUS_PER_PROC, 1))
            found = gpu_binding.shares([(h, registry.hosts[h].hostname, registry.hosts[h].gpus)
                                        for h in registry.all_host_ids() if h in registry.hosts])
            busy = gpu_binding.bound([(m.name, p.host_id, m.rank_env.get(str(r)))
                                      for m in registry.proc_meshes.values() if m.name != name
                                      for r, p in enumerate(m.procs) if p.exit_code is None])
            return gpu_binding.plan(per_host, host_extent, hosts, found, header.get(gpus.BIND_GPUS, True), per_proc,
                                    busy)
        except ValueError as e:
            raise HubError(str(e), "ValueError") from None

    async def spawn_actors(self, header, message):
        name = header["name"]
        check_mesh_name(name)
        mesh = self._registry.proc_meshes.get(header["proc_mesh"])
        if mesh is None:
            # Monarch's words, which programs written for it match.
            raise HubError(f"`ProcMesh` has already been stopped: proc mesh {header['proc_mesh']!r} is gone; "
                           "spawn new procs (host.spawn_procs) to spawn actors", "ValueError")
        key = actor_mesh_key(mesh.name, name)
        async with self._one_spawn_at_a_time(key):
            existing = self._registry.actor_meshes.get(key)
            owner = header.get("owner")
            if existing is not None and owner is not None and not header.get("replace") and (
                    existing.owner or {}).get("address") != owner["address"]:
                # As in Monarch, an actor spawning a name another owner's mesh has gets a
                # mesh of its own (which it supervises), named for it.
                return await self.spawn_actors({**header, "name": f"{name}.{owner['mesh']}-{owner['rank']}"},
                                               message)
            if existing is not None:
                same = existing.proc_ranks == header["proc_ranks"] and existing.class_name == header["class_name"]
                differs = _differing(existing.digests, header.get(hub_ops.SPAWN_DIGESTS))
                if header.get("replace"):
                    await self.stop_actor_mesh(existing)
                elif same and differs:
                    raise HubError(f"an actor mesh named {name!r} exists on proc mesh {mesh.name!r}, made from "
                                   f"{differs} ({existing.class_name}); it still runs that: pass replace=True to "
                                   "stop it and make this one, or choose another name (cluster.actor_meshes"
                                   f"[{existing.key!r}] is the live one)", "ValueError")
                elif same:
                    return self.actor_mesh_view(existing)
                else:
                    raise HubError(f"an actor mesh named {name!r} exists on proc mesh {mesh.name!r} "
                                   f"({existing.class_name} over {existing.extent}); choose another name, or pass "
                                   "replace=True to stop it first", "ValueError")
            dead = [mesh.procs[r].proc_id for r in header["proc_ranks"] if mesh.procs[r].exit_code is not None]
            if dead:
                raise HubError(f"procs {', '.join(dead)} of {mesh.name!r} have exited; spawn a new proc mesh")
            body = bytes(message.body)
            buffers = [bytes(b) for b in message.buffers]
            payload_id = f"a{self._registry.next_number()}"
            raise_init_errors = header.get(hub_ops.RAISE_INIT_ERRORS, False)
            constructing = self._spawning_actors[key] = [mesh.procs[r] for r in header["proc_ranks"]]
            callers = self._callers(header, constructing)
            proc_gone = self._construct_lost[key] = asyncio.get_running_loop().create_future()
            asking = asyncio.gather(*(
                self._net.request(mesh.procs[r].address, {
                    envelope.OP: proc_ops.SPAWN_ACTOR, proc_ops.MESH: name, envelope.RANK: i,
                    proc_ops.EXTENT: header["extent"], proc_ops.ORIGIN: header.get(proc_ops.ORIGIN),
                    proc_ops.MAIN_THREAD: header.get(proc_ops.MAIN_THREAD, False),
                    proc_ops.INIT_FAULT: not raise_init_errors, **callers[i],
                    "owner": header.get("owner"), **self._debug.spawn_fields()},
                    body, buffers)
                for i, r in enumerate(header["proc_ranks"])))
            try:
                await asyncio.wait([asking, proc_gone], return_when=asyncio.FIRST_COMPLETED)
            finally:
                if self._spawning_actors.get(key) is constructing:
                    del self._spawning_actors[key]
                if self._construct_lost.get(key) is proc_gone:
                    del self._construct_lost[key]
                abandoned = key in self._abandoned
                self._abandoned.discard(key)
                if not asking.done():  # a proc is gone
                    asking.cancel()
                    asking.add_done_callback(lambda f: f.cancelled() or f.exception())  # (retrieved: not logged)
            if not asking.done() or asking.cancelled():
                await self._stop_constructing(name, constructing)
                raise HubError(f"actor mesh {name!r} was not created: {proc_gone.result()} while its actors were "
                               "being constructed; spawn it again on live procs")
            replies = asking.result()
            addresses = [r.header[proc_ops.ADDRESS] for r in replies]
            failures = {r.header[envelope.RANK]: bytes(r.body) for r in replies if not r.header[envelope.OK]}
            record = ActorMeshRecord(name, mesh.name, header["proc_ranks"], header["extent"], header["class_name"],
                                     header["endpoints"], header.get("methods", []), addresses, payload_id,
                                     owner=header.get("owner"), digests=header.get(hub_ops.SPAWN_DIGESTS))
            if failures and (raise_init_errors or abandoned):
                await self.stop_actor_mesh(record)
                return {"failures": failures}
            try:
                await self._registry.keep_payload(payload_id, [body, *buffers])
            except OSError as e:  # a full disk: a mesh that a recovered hub could not restart is not made
                await self.stop_actor_mesh(record)
                raise HubError(f"actor mesh {name!r} was not created: its constructor could not be kept for "
                               f"restarts in {self._registry.path}: {e}; free space there and spawn it again") from None
            gone = [p for p in constructing if p.exit_code is not None]
            if gone:  # while the constructor was written (the loop ran meanwhile): as if during construction
                self._registry.drop_payload(payload_id)
                await self.stop_actor_mesh(record)
                raise HubError(f"actor mesh {name!r} was not created: {self._registry.describe(gone[0])} exited "
                               "while its actors were being constructed; spawn it again on live procs")
            self._registry.actor_meshes[key] = record
            statuses = {mesh.procs[r].proc_id: [0.0, reply.header[proc_ops.STATUS], mesh.procs[r].address]
                        for r, reply in zip(header["proc_ranks"], replies) if proc_ops.STATUS in reply.header}
            if statuses and self.on_statuses is not None:
                self.on_statuses(statuses, time.monotonic())
            for address in record.addresses:  # (a port of a forgotten actor the OS gave again)
                self.forgotten.pop(address, None)
            await self._registry.save(record)  # on disk before the reply: a recovered hub has it
            view = self.actor_mesh_view(record)
            view[hub_ops.INIT_FAILED] = []
            for r in replies:  # Monarch: a raising __init__ is a supervision fault, the mesh lives on
                if not r.header["ok"]:
                    rank = r.header["rank"]
                    view[hub_ops.INIT_FAILED].append(rank)
                    cause = f"__init__ raised {r.header.get('error', '')}"
                    view["dead"][str(rank)] = record.gone_report(rank, cause)
                    await self.actor_died(record, rank, cause, "__init__", r.header.get(proc_ops.TRACEBACK, ""))
            return view

    async def _stop_constructing(self, name: str, procs: list[ProcRecord]) -> None:
        """Stop actor mesh ``name`` in those of ``procs`` still alive, constructed or
        not (a spawn that failed part way)."""
        await asyncio.gather(*(
            self._net.request(p.address, {envelope.OP: proc_ops.STOP_ACTOR, proc_ops.MESH: name},
                              timeout=STOP_ACTOR_TIMEOUT_S)
            for p in procs if p.exit_code is None), return_exceptions=True)

    async def stop_actors(self, header, message):
        """Stop actor mesh ``name`` of ``proc_mesh`` (without ``proc_mesh``: ``name`` is a
        key, or a name only one proc mesh has)."""
        name = header["name"]
        if header.get("proc_mesh") is None:
            record = self._registry.find_actor_mesh(name)
            key = record.key if record is not None else name
        else:
            key = actor_mesh_key(header["proc_mesh"], name)
            record = self._registry.actor_meshes.get(key)
        if record is not None:
            return {"stuck": await self.stop_actor_mesh(record)}
        # Still being spawned (its client gave up waiting): interrupt the constructors;
        # the spawn then fails and stops what was made.
        constructing = self._spawning_actors.get(key, [])
        if constructing:
            self._abandoned.add(key)
        name = key.rpartition("/")[2]
        replies = await asyncio.gather(*(
            self._net.request(p.address, {envelope.OP: proc_ops.STOP_ACTOR, proc_ops.MESH: name},
                              timeout=STOP_ACTOR_TIMEOUT_S)
            for p in constructing if p.exit_code is None), return_exceptions=True)
        return {"stuck": [{"rank": i, "running": r.header.get("running")} for i, r in enumerate(replies)
                          if not isinstance(r, BaseException) and r.header.get("stopped") is False]}

    async def proc_up(self, header, message):
        progress = self._spawning.get(header[agent_ops.PROC_ID].rpartition("/")[0])
        if progress is not None:
            progress[0] += 1

    def _callers(self, header: dict, procs: list) -> list[dict]:
        """Whom each new actor connects to while its ``__init__`` runs, and tells where it
        is (``proc_ops.CALLER``, ``ANNOUNCE``): its host's router for a mesh the client
        calls through the routers (``hub_ops.ROUTED``), else the caller the client named."""
        if not header.get(hub_ops.ROUTED):
            caller = {proc_ops.CALLER: header.get(proc_ops.CALLER), proc_ops.ANNOUNCE: header.get(proc_ops.ANNOUNCE)}
            return [caller] * len(procs)
        hosts = self._registry.hosts
        routers = [getattr(hosts.get(p.host_id), "router", "") or None for p in procs]
        return [{proc_ops.CALLER: router, proc_ops.ANNOUNCE: router is not None} for router in routers]

    async def spawn_progress(self, header, message):
        """How many procs of the spawn ``spawn_id`` have started so far."""
        up = [p[0] for p in self._spawning.values() if p[1] == header["spawn_id"]]
        return {"up": up[0] if up else None}

    def starting(self) -> dict[str, tuple[int, int]]:
        """Proc meshes being spawned: name -> (procs up, procs asked for)."""
        return {name: (up, size) for name, (up, _, size) in self._spawning.items()}

    async def stop_procs(self, header, message):
        record = self._registry.proc_meshes.get(header["name"])
        if record is not None:
            await self.stop_proc_mesh(record)
        return {}

    def actor_mesh_view(self, record: ActorMeshRecord) -> dict:
        """What clients are told of an actor mesh: the record, and ``dead`` (rank -> why,
        see ``ActorMeshRecord.gone_report``) for ranks whose proc is gone, so that calls
        to them fail at once."""
        mesh = self._registry.proc_meshes.get(record.proc_mesh)
        dead = {}
        for i, r in enumerate(record.proc_ranks):
            proc = mesh.procs[r] if mesh is not None and r < len(mesh.procs) else None
            if proc is None:
                dead[str(i)] = record.gone_report(i, "its proc mesh was stopped", stopped=True)
            elif proc.exit_code is not None:
                dead[str(i)] = record.gone_report(
                    i, f"proc {proc.proc_id} (pid {proc.pid}) {proc.cause or exit_cause(proc.exit_code)}",
                    proc_exit=proc.exit_code)
        return {**record.public(), "dead": dead}

    def dead_actors(self) -> dict[str, tuple[str, int, str]]:
        """Every actor of the actor meshes whose proc is gone, as ``actors_gone`` names
        them (address -> mesh name, rank, report). An actor whose proc lives answers
        every call itself, dead or not."""
        gone = dict(self.forgotten)
        for record in self._registry.actor_meshes.values():
            for rank, report in self.actor_mesh_view(record)["dead"].items():
                gone[record.addresses[int(rank)]] = (record.name, int(rank), report)
        return gone

    async def stop_actor_mesh(self, record: ActorMeshRecord) -> list[dict]:
        """Stop the actors of ``record``; returns those that did not stop within the
        procs' wait (``rank``, ``running``: the endpoint they are still in)."""
        self.forget_actor_mesh(record)
        # Calls to them fail, now and later.
        await self._announcer.announce({envelope.OP: events.ACTORS_GONE, "actors": {
            a: (record.name, i, record.gone_report(i, "its actor mesh was stopped", stopped=True))
            for i, a in enumerate(record.addresses)}})
        self.stop_orphans(set(record.addresses))
        for address in record.addresses:
            self._net.forget(address)
        mesh = self._registry.proc_meshes.get(record.proc_mesh)
        if mesh is None:
            return []
        live = [(i, mesh.procs[r]) for i, r in enumerate(record.proc_ranks) if mesh.procs[r].exit_code is None]
        replies = await asyncio.gather(*(
            self._net.request(p.address, {envelope.OP: proc_ops.STOP_ACTOR, proc_ops.MESH: record.name},
                              timeout=STOP_ACTOR_TIMEOUT_S)
            for _, p in live), return_exceptions=True)
        return [{"rank": i, "running": r.header.get("running")} for (i, _), r in zip(live, replies)
                if not isinstance(r, BaseException) and r.header.get("stopped") is False]

    async def stop_proc_mesh(self, record: ProcMeshRecord) -> None:
        if self._registry.proc_meshes.get(record.name) is not record:
            return  # already stopped (e.g. as an orphan and by its owner at once)
        del self._registry.proc_meshes[record.name]  # before any await: a second stop returns above
        describe = self._registry.describe
        gone = await self.actors_gone([(record, rank, proc, f"{describe(proc)} {proc.cause or 'was stopped'}")
                                       for rank, proc in enumerate(record.procs) if proc.exit_code is None],
                                      stopped=True)
        self.stop_orphans(gone)  # (waiting calls failed above)
        for actor_mesh in self._registry.actor_meshes_of(record.name):
            self.forget_actor_mesh(actor_mesh)
        saved = self._registry.save(record)
        await self._launcher.stop(record.procs)
        await saved  # a stop answered is on disk: a recovered hub does not list the mesh

    def forget_actor_mesh(self, record: ActorMeshRecord, gone: str | None = None) -> None:
        """Drop ``record`` from the registry; with ``gone`` (why), its actors are told to
        every client that joins from now on as dead (``dead_actors``)."""
        if gone is not None:
            self.forgotten.update({address: (record.name, i, record.gone_report(i, gone))
                                   for i, address in enumerate(record.addresses)})
        if self._registry.actor_meshes.get(record.key) is record:
            del self._registry.actor_meshes[record.key]
            self._registry.drop_payload(record.payload_id)
            self._registry.save(record)

    async def actors_gone(self, deaths: list[tuple[ProcMeshRecord, int, ProcRecord, str]],
                          stopped: bool = False, routers: dict[str, str] | None = None) -> set[str]:
        """These procs died (mesh, rank, proc, why), or were ``stopped``: every client
        learns, in one event, which actors went with them and why, so that calls waiting
        on them fail now (``SupervisionError``, naming every dead rank) instead of never.
        Returns the addresses of those actors (whose orphans the caller stops)."""
        actors: dict[str, tuple[str, int, str]] = {}
        for mesh, rank, proc, why in deaths:
            for key, constructing in self._spawning_actors.items():
                lost = self._construct_lost.get(key)
                if lost is not None and not lost.done() and any(p is proc for p in constructing):
                    lost.set_result(why)  # the spawn answers now instead of never
            for record, i in self._registry.actors_on(mesh.name, rank):
                actors[record.addresses[i]] = (record.name, i,
                                               record.gone_report(i, why, stopped, proc_exit=proc.exit_code))
        event = {envelope.OP: events.ACTORS_GONE, "actors": actors}
        if routers:
            event[events.ROUTERS_GONE] = routers  # (a client's calls relayed through one fail)
        await self._announcer.announce(event)
        for _, _, proc, _ in deaths:  # no more sockets to them (a host taken back makes new ones)
            self._net.forget(proc.address)
        for address in actors:
            self._net.forget(address)
        return set(actors)

    def stop_orphans(self, gone: set[str]) -> None:
        """Meshes spawned by the actors at addresses ``gone`` have no owner left to use or
        supervise them: they are stopped (not left running, holding memory and GPUs)."""
        owned = self._registry.owned_by(gone)  # by index: no scan of every mesh
        for record in [m for m in owned if isinstance(m, ProcMeshRecord)]:
            print(f"monarch_nb hub: stopping proc mesh {record.name!r}: its owner {record.owner['mesh']} rank "
                  f"{record.owner['rank']} is gone", file=sys.stderr)
            asyncio.ensure_future(self.stop_proc_mesh(record))
        for actors in [m for m in owned if isinstance(m, ActorMeshRecord)]:
            print(f"monarch_nb hub: stopping actor mesh {actors.name!r}: its owner {actors.owner['mesh']} rank "
                  f"{actors.owner['rank']} is gone", file=sys.stderr)
            asyncio.ensure_future(self.stop_actor_mesh(actors))


def _with_rank_env(bound: list[dict], rank_env: list[dict] | None, procs: int) -> list[dict]:
    """Each proc's start environment: its GPU binding (``bound``, ``[]`` when none) with
    the spawn's own per-rank environment (``spawn_procs(bootstrap_command=)``) over it."""
    if not rank_env:
        return bound
    if len(rank_env) != procs:
        raise HubError(f"spawn_procs gave {len(rank_env)} per-rank environments for {procs} procs", "ValueError")
    return [{**(bound[r] if bound else {}), **rank_env[r]} for r in range(procs)]


def _differing(kept: dict | None, asked: dict | None) -> str:
    """What of a spawn (``asked``: its digests) differs from the live mesh's construction
    (``kept``), in words ("" when nothing known does): ``client.spawn_digest``."""
    kept, asked = kept or {}, asked or {}
    what = {"code": "other code of its class", "args": "other constructor arguments"}
    return " and ".join(words for key, words in what.items()
                        if kept.get(key) is not None and asked.get(key) is not None and kept[key] != asked[key])
