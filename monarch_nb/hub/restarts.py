"""Recovery from failures: ``restart_procs`` starts new procs in place of failed ones
(same host, same proc id) and re-creates every actor that lived on them from its saved
constructor payload, at the same address when it is free. An actor whose ``__init__``
raises again is a failure of that actor alone (as at spawn): the proc and its other
meshes serve on, and the reply names the broken mesh.

Variables set in procs since their start (``set_rank_env``: torch's ``RANK`` and the
like) are kept per rank, so a restarted proc starts with them.
"""

from __future__ import annotations

import asyncio

from ..protocol import envelope, proc_ops
from ..wire.aio import AioEndpoint
from ..wire.frames import Message
from .debug_ops import DebugRegistry
from .errors import HubError
from .launcher import ProcLauncher
from .mesh_ops import MeshOps
from .records import ActorMeshRecord, ProcMeshRecord
from .registry import Registry
from .supervision import Supervision


class Restarts:
    """Restarts procs of ``registry``'s meshes through ``launcher``; the procs replaced
    are stopped as expected deaths (``supervision``), actors re-created with
    ``debug``'s configuration, and described as ``meshes`` describes them."""

    def __init__(self, registry: Registry, net: AioEndpoint, launcher: ProcLauncher, supervision: Supervision,
                 meshes: MeshOps, debug: DebugRegistry):
        self._registry = registry
        self._net = net
        self._launcher = launcher
        self._supervision = supervision
        self._meshes = meshes
        self._debug = debug

    async def restart_procs(self, header, message):
        """Start new procs for ``ranks`` of proc mesh ``name`` (default: the failed ones;
        live ones named are stopped first) and re-create their actors. Replies with the
        mesh and every actor mesh on it (addresses may have changed)."""
        mesh = self._registry.proc_meshes.get(header["name"])
        if mesh is None:
            raise HubError(f"no proc mesh named {header['name']!r}; it was stopped", "ValueError")
        ranks = header.get("ranks")
        if ranks is None:
            ranks = [r for r, p in enumerate(mesh.procs) if p.exit_code is not None]
        bad = [r for r in ranks if not 0 <= r < len(mesh.procs)]
        if bad:
            raise HubError(f"{mesh.name!r} has ranks 0-{len(mesh.procs) - 1}, not {bad}", "ValueError")
        hosts = self._registry.hosts
        lost = [r for r in ranks if mesh.procs[r].host_id not in hosts or hosts[mesh.procs[r].host_id].lost]
        if lost:
            raise HubError(f"ranks {lost} of {mesh.name!r} were on a lost host; spawn a new proc mesh")
        failed = await self._restart(mesh, sorted(set(ranks))) if ranks else {}
        views = {n: self._meshes.actor_mesh_view(a) for n, a in self._registry.actor_meshes.items()
                 if a.proc_mesh == mesh.name}
        for key, reports in failed.items():  # calls to them fail at once (their procs live)
            if key in views:
                views[key]["dead"].update({str(rank): report for rank, (_, report) in reports.items()})
        return {"proc_mesh": mesh.public(), "restarted": ranks, "actor_meshes": views,
                "failures": {key: {rank: packed for rank, (packed, _) in reports.items()}
                             for key, reports in failed.items()}}

    async def set_rank_env(self, header, message):
        """Remember variables set in procs of a mesh since their start (``env``: rank ->
        variables), so that a restarted proc starts with them (torch's RANK, ...)."""
        mesh = self._registry.proc_meshes.get(header["name"])
        if mesh is None:
            raise HubError(f"no proc mesh named {header['name']!r}; it was stopped", "ValueError")
        for r, env in header["env"].items():  # (added to what spawn_procs set: a GPU binding stays)
            mesh.rank_env.setdefault(str(r), {}).update(env)
        await self._registry.save(mesh)  # on disk before the reply
        return {}

    async def _restart(self, mesh: ProcMeshRecord, ranks: list[int]) -> dict[str, dict[int, tuple[bytes, str]]]:
        """New procs for ``ranks``, then every actor that lived on them. An actor whose
        ``__init__`` raises again is left dead on its new proc (it answers calls with its
        failure), and supervision hears of it as of any actor's death; its proc and the
        actors of other meshes there serve on (stopping the proc made one broken mesh
        keep every other mesh of the proc failed). Returns those failures: actor mesh
        key -> rank -> (packed exception, unpickled by the client only; the report calls
        to it raise)."""
        live = [mesh.procs[r] for r in ranks if mesh.procs[r].exit_code is None]
        for proc in live:  # an explicit restart of a live rank: it is stopped, as expected
            proc.exit_code = 0
        await self._supervision.procs_died([(mesh, mesh.procs.index(p), p) for p in live], expected=True,
                                           cause="was restarted")
        await self._launcher.stop(live)
        by_host: dict[str, list[str]] = {}
        for r in ranks:
            by_host.setdefault(mesh.procs[r].host_id, []).append(mesh.procs[r].proc_id)
        new = {p.proc_id: p for p in await self._launcher.start(
            by_host, mesh.launch, {mesh.procs[r].proc_id: mesh.rank_env[str(r)] for r in ranks
                                   if str(r) in mesh.rank_env})}
        if self._registry.proc_meshes.get(mesh.name) is not mesh:  # stopped meanwhile
            await self._launcher.stop(list(new.values()))
            raise HubError(f"proc mesh {mesh.name!r} was stopped during the restart", "ValueError")
        for r in ranks:
            mesh.procs[r] = new[mesh.procs[r].proc_id]
        await self._registry.save(mesh)  # the new pids and addresses, before any reply
        failures: dict[str, dict[int, tuple[bytes, str]]] = {}
        for record in self._registry.actor_meshes_of(mesh.name):
            failed = await self._respawn_actors(mesh, record, [r for r in ranks if r in record.proc_ranks])
            for rank, reply in sorted(failed.items()):
                cause = f"__init__ raised {reply.header.get(envelope.ERROR, '')} (when its proc was restarted)"
                failures.setdefault(record.key, {})[rank] = (bytes(reply.body), record.gone_report(rank, cause))
                await self._supervision.actor_died(record, rank, cause, "__init__",
                                                   reply.header.get(proc_ops.TRACEBACK, ""))
        return failures

    async def _respawn_actors(self, mesh: ProcMeshRecord, record: ActorMeshRecord,
                              proc_ranks: list[int]) -> dict[int, Message]:
        """Construct ``record``'s actors again on the new procs at ``proc_ranks``;
        returns the replies of the ranks whose ``__init__`` raised (rank -> reply, its
        body the packed exception). Those actors stay, dead (``INIT_FAULT``)."""
        if not proc_ranks:
            return {}
        frames = await self._registry.payload(record.payload_id)
        if frames is None:
            raise HubError(f"the constructor arguments of {record.name!r} were not kept; spawn it again")
        body, buffers = frames[0], frames[1:]
        indices = [record.proc_ranks.index(r) for r in proc_ranks]
        for i in indices:  # made again: alive unless its __init__ raises again (actor_died)
            record.died.pop(str(i), None)
        replies = await asyncio.gather(*(
            self._net.request(mesh.procs[record.proc_ranks[i]].address, {
                envelope.OP: proc_ops.SPAWN_ACTOR, proc_ops.MESH: record.name, envelope.RANK: i,
                proc_ops.EXTENT: record.extent, proc_ops.ORIGIN: None, proc_ops.PREFER: record.addresses[i],
                proc_ops.INIT_FAULT: True, "owner": record.owner, **self._debug.spawn_fields()},
                body, buffers)
            for i in indices))
        for r in replies:
            record.addresses[r.header[envelope.RANK]] = r.header[proc_ops.ADDRESS]
        await self._registry.save(record)
        return {r.header[envelope.RANK]: r for r in replies if not r.header[envelope.OK]}
