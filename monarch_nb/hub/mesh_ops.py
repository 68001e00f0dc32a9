"""Proc meshes and actor meshes in the hub: spawn, stop and describe them.

Procs are started by the host agents (all at once, per host); actors by their procs,
from the constructor payload that passes through as opaque bytes (also kept for
restarts and, in a retained cluster, under ``spawn/`` in the state directory).
"""

from __future__ import annotations

import asyncio

from .. import cluster_dir
from ..mesh import Extent
from . import state
from .errors import HubError
from .registry import ActorMeshRecord, ProcMeshRecord, ProcRecord, exit_cause

SPAWN_TIMEOUT_S = 120.0  # an agent answers within its own 60 s proc start timeout, or is gone


def check_mesh_name(name) -> None:
    """Raise ``HubError`` (a ``ValueError`` for the client) for a name that can't be a
    mesh's (it also makes proc ids ``NAME/RANK``)."""
    if not cluster_dir.is_valid_name(name):
        raise HubError(f"mesh name {name!r}: {cluster_dir.NAME_RULE}", "ValueError")


class MeshOps:
    """Mixin of ``Hub``: the mesh operations and their helpers."""

    async def op_spawn_procs(self, header, message):
        try:
            per_host = Extent(header["per_host"])
        except ValueError as e:
            raise HubError(f"bad per_host: {e}", "ValueError") from None
        if "hosts" in per_host:
            raise HubError("per_host must not name the 'hosts' dimension; the host mesh provides it",
                           "ValueError")
        hosts = header.get("hosts") or self.host_order
        gone = [h for h in hosts if h not in self.hosts or self.hosts[h].lost]
        if gone:
            causes = "; ".join(f"{h}: {self.hosts[h].cause or 'its agent fell silent'}" if h in self.hosts
                               else f"{h}: unknown" for h in gone)
            raise HubError(f"can't start procs on lost host(s) ({causes}); stop this cluster and start a new one")
        extent = {"hosts": len(hosts), **per_host}
        name = header.get("name")
        if name is None:
            self._mesh_counter += 1
            name = f"procs{self._mesh_counter}"
        check_mesh_name(name)
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
        launch = {k: header.get(k) for k in ("env", "cwd", "python")}
        self.spawning[name] = [0, header.get("spawn_id"), len(hosts) * per]
        self._health_changed()
        try:
            procs = await self._start_procs(
                {host_id: [f"{name}/{h * per + i}" for i in range(per)] for h, host_id in enumerate(hosts)}, launch)
        finally:
            self.spawning.pop(name, None)
        record = self.proc_meshes[name] = ProcMeshRecord(name, extent, procs, owner=header.get("owner"),
                                                         launch=launch)
        self._save()
        return record.public()

    async def op_spawn_actors(self, header, message):
        name = header["name"]
        check_mesh_name(name)
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
        constructing = self.spawning_actors[name] = [mesh.procs[r] for r in header["proc_ranks"]]
        try:
            replies = await asyncio.gather(*(
                self.net.request(mesh.procs[r].address, {"op": "spawn_actor", "mesh": name, "rank": i,
                                                           "extent": header["extent"], "o": header.get("o"),
                                                           "main_thread": header.get("main_thread", False),
                                                           "owner": header.get("owner"), **self.debug_spawn_fields()},
                                 body, buffers)
                for i, r in enumerate(header["proc_ranks"])))
        finally:
            if self.spawning_actors.get(name) is constructing:
                del self.spawning_actors[name]
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
            return {"stuck": await self._stop_actor_mesh(record)}
        # Still being spawned (its client gave up waiting): interrupt the constructors;
        # the spawn then fails and stops what was made.
        constructing = self.spawning_actors.get(header["name"], [])
        replies = await asyncio.gather(*(
            self.net.request(p.address, {"op": "stop_actor", "mesh": header["name"]}, timeout=5.0)
            for p in constructing if p.exit_code is None), return_exceptions=True)
        return {"stuck": [{"rank": i, "running": r.header.get("running")} for i, r in enumerate(replies)
                          if not isinstance(r, BaseException) and r.header.get("stopped") is False]}

    async def op_stop_procs(self, header, message):
        record = self.proc_meshes.get(header["name"])
        if record is not None:
            await self._stop_proc_mesh(record)
        return {}

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
                dead[str(i)] = f"proc {proc.proc_id} (pid {proc.pid}) {proc.cause or exit_cause(proc.exit_code)}"
        return {**record.public(), "dead": dead}

    async def _start_procs(self, ids_by_host: dict[str, list[str]], launch: dict,
                           env_by_proc: dict[str, dict] | None = None) -> list[ProcRecord]:
        """Have each host's agent start the procs ``ids_by_host[host]``, all at once;
        returns them in that order. If any host fails (or is silent for
        ``SPAWN_TIMEOUT_S``), the procs that did start are stopped and ``HubError`` says
        why."""
        hosts = list(ids_by_host)
        replies = await asyncio.gather(*(
            self.net.request(self.hosts[h].address, {
                "op": "spawn_procs", "proc_ids": ids_by_host[h], "env": launch.get("env") or {},
                "cwd": launch.get("cwd"), "python": launch.get("python"),
                "env_by_proc": {p: env_by_proc[p] for p in ids_by_host[h] if p in (env_by_proc or {})}},
                timeout=SPAWN_TIMEOUT_S)
            for h in hosts), return_exceptions=True)
        errors = [f"host agent {h} did not answer within {SPAWN_TIMEOUT_S:.0f} s" if isinstance(r, BaseException)
                  else r.header["error"] for h, r in zip(hosts, replies)
                  if isinstance(r, BaseException) or not r.header["ok"]]
        procs = [ProcRecord(**p) for r in replies if not isinstance(r, BaseException) and r.header["ok"]
                 for p in r.header["procs"]]
        if errors:
            await self._stop_procs(procs)
            raise HubError("; ".join(errors))
        return procs

    async def _stop_actor_mesh(self, record: ActorMeshRecord) -> list[dict]:
        """Stop the actors of ``record``; returns those that did not stop within the
        procs' wait (``rank``, ``running``: the endpoint they are still in)."""
        self._forget_actor_mesh(record)
        await self._announce({"op": "actors_gone", "actors": {  # calls to them fail, now and later
            a: (record.name, i, "its actor mesh was stopped") for i, a in enumerate(record.addresses)}})
        self._stop_orphans(set(record.addresses))
        for address in record.addresses:
            self.net.forget(address)
        mesh = self.proc_meshes.get(record.proc_mesh)
        if mesh is None:
            return []
        live = [(i, mesh.procs[r]) for i, r in enumerate(record.proc_ranks) if mesh.procs[r].exit_code is None]
        replies = await asyncio.gather(*(
            self.net.request(p.address, {"op": "stop_actor", "mesh": record.name}, timeout=5.0)
            for _, p in live), return_exceptions=True)
        return [{"rank": i, "running": r.header.get("running")} for (i, _), r in zip(live, replies)
                if not isinstance(r, BaseException) and r.header.get("stopped") is False]

    async def _stop_proc_mesh(self, record: ProcMeshRecord) -> None:
        if self.proc_meshes.get(record.name) is not record:
            return  # already stopped (e.g. as an orphan and by its owner at once)
        del self.proc_meshes[record.name]  # before any await: a second stop returns above
        await self._procs_died([(record, rank, proc) for rank, proc in enumerate(record.procs)  # waiting calls fail
                                if proc.exit_code is None], expected=True)
        for actor_mesh in [a for a in self.actor_meshes.values() if a.proc_mesh == record.name]:
            self._forget_actor_mesh(actor_mesh)
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
