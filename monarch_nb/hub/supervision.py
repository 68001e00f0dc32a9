"""Supervision in the hub: failures travel actor → proc → host → hub → owner → client.

A failure is a proc that exited or was killed (its host agent reports the exit at
once), a proc lost with its host (agent silent for ``HOST_TIMEOUT_S``), or an
exception in a ``broadcast`` endpoint (nobody to reply to; the actor reports it).

A host lost for its silence whose agent is heard from again (the network or the
agent was stalled) is taken back: its procs that still run are live again, those
that exited meanwhile are failed with their exit code.

For each failure the hub

1. tells every client which actor addresses died (``actors_gone``), so that calls
   waiting on them fail at once with ``SupervisionError``;
2. asks the mesh's owner, if an actor spawned it, to handle it: the owner's
   ``__supervise__(failure)`` runs in its message loop; a truthy return handles it;
3. otherwise announces it to clients as ``supervision`` (unhandled): a notebook shows
   it, and the next call on the affected mesh raises it (see ``client.supervision``).

Meshes an actor spawned are stopped when that actor is gone (its proc died or was
stopped, or its mesh was stopped): nobody is left to use them.

Recovery: ``restart_procs`` starts new procs in place of failed ones (same host, same
proc id) and re-creates every actor that lived on them from its saved constructor
payload, at the same address when it is free.
"""

from __future__ import annotations

import asyncio
import sys

from . import state
from .errors import HubError
from .registry import LOST_EXIT_CODE, ActorMeshRecord, HostRecord, ProcMeshRecord, ProcRecord, exit_cause

SUPERVISE_TIMEOUT_S = 10.0  # an owner busy longer than this leaves the failure unhandled
REJOIN_TIMEOUT_S = 3.0  # how long a lost host's agent, heard again, has to say which procs still run


def last_words(lines: list[str]) -> list[str]:
    """What to quote of a dying proc's last stderr ``lines``: after a crash dumped by
    faulthandler, its ``Fatal Python error`` line and the innermost frame of the
    crashing thread; else the last 3 non-empty lines."""
    for i, line in enumerate(lines):
        if line.startswith("Fatal Python error"):
            frames = [t.strip() for t in lines[i:] if t.strip().startswith("File ")]
            return [line] + frames[:1]
    return [t for t in lines if t.strip()][-3:]


class SupervisionOps:
    """Mixin of ``Hub``: failure reports, escalation to owners and clients, restarts."""

    # failures ------------------------------------------------------------------------
    async def op_proc_exited(self, header, message):
        for mesh in self.proc_meshes.values():
            for rank, proc in enumerate(mesh.procs):
                # The pid too: a late report about a stopped mesh's proc must not hit the
                # new proc of the same id in a mesh spawned again under that name.
                if proc.proc_id == header["proc_id"] and proc.pid == header.get("pid", proc.pid):
                    if proc.exit_code is not None:
                        return  # already failed (lost with its host, or stopped for a restart)
                    proc.exit_code = header["returncode"]
                    self._save()
                    await self._procs_died([(mesh, rank, proc)], header.get("expected", False))

    async def _host_lost(self, host: HostRecord, silent_s: float) -> None:
        """A host agent fell silent: its procs (which die with it) are failed."""
        host.lost = True
        self.net.forget(host.address)  # what is queued for it is moot; _host_back talks to it again
        print(f"monarch_nb hub: host agent {host.host_id} (pid {host.pid}) silent for {silent_s:.1f} s; "
              "its procs are lost", file=sys.stderr)
        await self._procs_died(self._lose_procs_of(host), False,
                               f"was lost with its host {host.hostname} (agent pid {host.pid} silent for "
                               f"{silent_s:.1f} s)")
        self._save()

    async def _host_back(self, host: HostRecord) -> None:
        """The agent of ``host``, lost for its silence, is heard from again: ask it which
        procs still run (as a recovering hub does) and take the host back with them.
        Clients learn it from ``health_changed`` and ``actors_back`` (addresses of the
        actors live again); handles made from the registry since see them live."""
        if host.host_id in self._rejoining:
            return
        self._rejoining.add(host.host_id)
        try:
            reply = await self.net.request(host.address, {"op": "adopt", "hub": self.net.address},
                                           timeout=REJOIN_TIMEOUT_S)
        except asyncio.TimeoutError:
            return  # still lost; tried again at its next heartbeat
        finally:
            self._rejoining.discard(host.host_id)
        if not host.lost or host.cause:
            return  # failed for good meanwhile (its allocation ended)
        live, exited = set(reply.header["procs"]), reply.header["exited"]
        host.lost = False
        back: dict[str, tuple[str, int]] = {}
        died = []
        for mesh in self.proc_meshes.values():
            for rank, proc in enumerate(mesh.procs):
                if proc.host_id != host.host_id or proc.exit_code != LOST_EXIT_CODE:
                    continue
                if proc.proc_id in live:
                    proc.exit_code = None
                    for record in self.actor_meshes.values():
                        if record.proc_mesh == mesh.name and rank in record.proc_ranks:
                            i = record.proc_ranks.index(rank)
                            back[record.addresses[i]] = (record.name, i)
                else:
                    proc.exit_code = exited.get(proc.proc_id, LOST_EXIT_CODE)
                    died.append(proc.proc_id)
        print(f"monarch_nb hub: host agent {host.host_id} (pid {host.pid}) is heard from again; taking it back"
              f" with {len(back)} live actor(s)" + (f"; procs {', '.join(died)} exited meanwhile" if died else ""),
              file=sys.stderr)
        self._save()
        await self._announce({"op": "actors_back", "actors": back})

    def _lose_procs_of(self, host: HostRecord) -> list[tuple[ProcMeshRecord, int, ProcRecord]]:
        """Mark the live procs of ``host`` lost; returns them (mesh, rank, proc)."""
        lost = []
        for mesh in self.proc_meshes.values():
            for rank, proc in enumerate(mesh.procs):
                if proc.host_id == host.host_id and proc.exit_code is None:
                    proc.exit_code = LOST_EXIT_CODE
                    lost.append((mesh, rank, proc))
        return lost

    async def _procs_died(self, deaths: list[tuple[ProcMeshRecord, int, ProcRecord]], expected: bool,
                          cause: str | None = None) -> None:
        """Every client learns, in one event, which actors died with these procs and why,
        so that calls waiting on them fail now (``SupervisionError``, naming every dead
        rank) instead of never; each unexpected death then goes to its mesh's owner, or
        to the clients as unhandled."""
        actors: dict[str, tuple[str, int, str]] = {}
        failures = []
        for mesh, rank, proc in deaths:
            why = self._death_cause(proc, expected, cause)
            hit = []
            for record in self.actor_meshes.values():
                if record.proc_mesh == mesh.name and rank in record.proc_ranks:
                    i = record.proc_ranks.index(rank)
                    actors[record.addresses[i]] = (record.name, i, why)
                    hit.append((record.name, i))
            if not expected:
                failures.append(({"kind": "proc_failed", "proc_mesh": mesh.name, "rank": rank,
                                  "meshes": sorted({n for n, _ in hit}), "ranks": sorted({i for _, i in hit}),
                                  "why": why, "endpoint": None}, mesh.owner))
        await self._announce({"op": "actors_gone", "actors": actors})
        for _, _, proc in deaths:  # no more sockets to them (a host taken back makes new ones)
            self.net.forget(proc.address)
        for address in actors:
            self.net.forget(address)
        for failure, owner in failures:
            asyncio.ensure_future(self._escalate(failure, owner))
        self._stop_orphans(set(actors))

    def _stop_orphans(self, gone: set[str]) -> None:
        """Meshes spawned by the actors at addresses ``gone`` have no owner left to use or
        supervise them: they are stopped (not left running, holding memory and GPUs)."""
        for record in [m for m in self.proc_meshes.values() if (m.owner or {}).get("address") in gone]:
            print(f"monarch_nb hub: stopping proc mesh {record.name!r}: its owner {record.owner['mesh']} rank "
                  f"{record.owner['rank']} is gone", file=sys.stderr)
            asyncio.ensure_future(self._stop_proc_mesh(record))
        for record in [a for a in self.actor_meshes.values() if (a.owner or {}).get("address") in gone]:
            print(f"monarch_nb hub: stopping actor mesh {record.name!r}: its owner {record.owner['mesh']} rank "
                  f"{record.owner['rank']} is gone", file=sys.stderr)
            asyncio.ensure_future(self._stop_actor_mesh(record))

    def _death_cause(self, proc: ProcRecord, expected: bool, cause: str | None) -> str:
        """Why ``proc`` is gone, as ``proc P (pid N on HOST) CAUSE; last stderr: ...``."""
        if cause is None:
            cause = proc.cause or ("was stopped" if expected else exit_cause(proc.exit_code))
            if proc.exit_code == -9 and not expected:  # SIGKILL: the usual sign of the OOM killer
                cause += " (by a person or program, or by the kernel's out-of-memory killer: see dmesg)"
        last = [] if expected else last_words([r[8] for r in self.logs.last(proc.proc_id, "stderr", 80)])
        host = self.hosts.get(proc.host_id)
        return (f"proc {proc.proc_id} (pid {proc.pid} on {host.hostname if host else proc.host_id}) {cause}"
                + (f"; last stderr: {' | '.join(last)}" if last else ""))

    async def op_actor_failed(self, header, message):
        """An actor's ``broadcast`` endpoint raised (the actor lives on)."""
        record = self.actor_meshes.get(header["mesh"])
        if record is None:
            return
        why = (f"{header['mesh']} rank {header['rank']}: broadcast {header['endpoint']} raised "
               f"{header['error']}")
        failure = {"kind": "endpoint_failed", "proc_mesh": record.proc_mesh, "meshes": [record.name],
                   "ranks": [header["rank"]], "why": why, "endpoint": header["endpoint"],
                   "traceback": header.get("traceback", "")}
        await self._escalate(failure, record.owner)

    async def _escalate(self, failure: dict, owner: dict | None) -> None:
        """Offer ``failure`` to ``owner`` (the actor that spawned the mesh); unhandled,
        it goes to the clients as ``supervision``."""
        if owner is not None:
            outcome = await self._offer_to_owner(failure, owner)
            if outcome.get("handled"):
                print(f"monarch_nb hub: {owner['mesh']} rank {owner['rank']} handled: {failure['why']}",
                      file=sys.stderr)
                return
            why = failure["why"] + (f"; not handled by {owner['mesh']} rank {owner['rank']}"
                                    + (f" ({outcome['error']})" if outcome.get("error") else ""))
            failure = {**failure, "why": why, "owner": owner}
        await self._announce({"op": "supervision", "failure": failure})

    async def _offer_to_owner(self, failure: dict, owner: dict) -> dict:
        try:
            reply = await self.net.request(owner["address"], {"k": "supervise", "failure": failure},
                                           timeout=SUPERVISE_TIMEOUT_S)
        except asyncio.TimeoutError:
            return {"handled": False, "error": f"the owner did not answer within {SUPERVISE_TIMEOUT_S} s"}
        return {"handled": bool(reply.header.get("handled")), "error": reply.header.get("error")}

    # recovery ------------------------------------------------------------------------
    async def op_restart_procs(self, header, message):
        """Start new procs for ``ranks`` of proc mesh ``name`` (default: the failed ones;
        live ones named are stopped first) and re-create their actors. Replies with the
        mesh and every actor mesh on it (addresses may have changed)."""
        mesh = self.proc_meshes.get(header["name"])
        if mesh is None:
            raise HubError(f"no proc mesh named {header['name']!r}; it was stopped", "ValueError")
        ranks = header.get("ranks")
        if ranks is None:
            ranks = [r for r, p in enumerate(mesh.procs) if p.exit_code is not None]
        bad = [r for r in ranks if not 0 <= r < len(mesh.procs)]
        if bad:
            raise HubError(f"{mesh.name!r} has ranks 0-{len(mesh.procs) - 1}, not {bad}", "ValueError")
        lost = [r for r in ranks if mesh.procs[r].host_id not in self.hosts or self.hosts[mesh.procs[r].host_id].lost]
        if lost:
            raise HubError(f"ranks {lost} of {mesh.name!r} were on a lost host; spawn a new proc mesh")
        failures = await self._restart(mesh, sorted(set(ranks))) if ranks else {}
        return {"proc_mesh": mesh.public(), "restarted": ranks, "failures": failures,
                "actor_meshes": {n: self._actor_mesh_view(a) for n, a in self.actor_meshes.items()
                                 if a.proc_mesh == mesh.name}}

    async def op_set_rank_env(self, header, message):
        """Remember variables set in procs of a mesh since their start (``env``: rank ->
        variables), so that a restarted proc starts with them (torch's RANK, ...)."""
        mesh = self.proc_meshes.get(header["name"])
        if mesh is None:
            raise HubError(f"no proc mesh named {header['name']!r}; it was stopped", "ValueError")
        mesh.rank_env.update({str(r): env for r, env in header["env"].items()})
        self._save()
        return {}

    async def _restart(self, mesh: ProcMeshRecord, ranks: list[int]) -> dict:
        """New procs for ``ranks``, then every actor that lived on them. A proc on which
        an actor's ``__init__`` raises again is stopped (so it stays failed, and a later
        restart tries again); returns those failures (actor mesh -> rank -> packed
        exception, unpickled by the client only)."""
        live = [mesh.procs[r] for r in ranks if mesh.procs[r].exit_code is None]
        for proc in live:  # an explicit restart of a live rank: it is stopped, as expected
            proc.exit_code = 0
        await self._procs_died([(mesh, mesh.procs.index(p), p) for p in live], expected=True, cause="was restarted")
        await self._stop_procs(live)
        by_host: dict[str, list[str]] = {}
        for r in ranks:
            by_host.setdefault(mesh.procs[r].host_id, []).append(mesh.procs[r].proc_id)
        new = {p.proc_id: p for p in await self._start_procs(
            by_host, mesh.launch, {mesh.procs[r].proc_id: mesh.rank_env[str(r)] for r in ranks
                                   if str(r) in mesh.rank_env})}
        if self.proc_meshes.get(mesh.name) is not mesh:  # stopped meanwhile
            await self._stop_procs(list(new.values()))
            raise HubError(f"proc mesh {mesh.name!r} was stopped during the restart", "ValueError")
        for r in ranks:
            mesh.procs[r] = new[mesh.procs[r].proc_id]
        self._save()
        failures: dict[str, dict[int, bytes]] = {}
        broken: set[int] = set()
        for record in [a for a in self.actor_meshes.values() if a.proc_mesh == mesh.name]:
            failed = await self._respawn_actors(mesh, record, [r for r in ranks if r in record.proc_ranks])
            if failed:
                failures[record.name] = failed
                broken.update(record.proc_ranks[i] for i in failed)
        if broken:
            for r in sorted(broken):
                mesh.procs[r].cause = "was stopped: an actor's __init__ raised when it was restarted"
            await self._stop_procs([mesh.procs[r] for r in sorted(broken)])
        return failures

    async def _respawn_actors(self, mesh: ProcMeshRecord, record: ActorMeshRecord,
                              proc_ranks: list[int]) -> dict[int, bytes]:
        """Construct ``record``'s actors again on the new procs at ``proc_ranks``;
        returns the ranks whose ``__init__`` raised (rank -> packed exception)."""
        if not proc_ranks:
            return {}
        frames = self.payloads.get(record.payload_id) or state.load_payload(self.path, record.payload_id)
        if frames is None:
            raise HubError(f"the constructor arguments of {record.name!r} were not kept; spawn it again")
        body, buffers = frames[0], frames[1:]
        indices = [record.proc_ranks.index(r) for r in proc_ranks]
        replies = await asyncio.gather(*(
            self.net.request(mesh.procs[record.proc_ranks[i]].address, {
                "op": "spawn_actor", "mesh": record.name, "rank": i, "extent": record.extent, "o": None,
                "prefer": record.addresses[i], "owner": record.owner, **self.debug_spawn_fields()},
                body, buffers)
            for i in indices))
        for r in replies:
            record.addresses[r.header["rank"]] = r.header["address"]
        self._save()
        return {r.header["rank"]: bytes(r.body) for r in replies if not r.header["ok"]}
