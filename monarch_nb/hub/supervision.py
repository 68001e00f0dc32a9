"""Supervision in the hub: failures travel actor → proc → host → hub → owner → client.

A failure is a proc that exited or was killed (its host agent reports the exit at
once), a proc lost with its host (agent silent for ``HOST_TIMEOUT_S``), an exception
in a ``broadcast`` endpoint of an actor that survives it (``survive_broadcast_errors``;
the actor reports it), or an actor that died while its proc lives on (the actor
reports why: see ``proc.actor_loop``), or whose ``__init__`` raised (``actor_died``,
from the spawn).

A host lost for its silence whose agent is heard from again (the network or the
agent was stalled) is taken back: its procs that still run are live again, those
that exited meanwhile are failed with their exit code.

For each failure the hub

1. queues it for the mesh's owner, if an actor spawned it, before anything else: the
   owner's proc puts it before the next message that actor takes and says so at once,
   busy or not (``supervise_actor``). Whoever calls the dead actors hears of it only
   after that (step 2; and a dying actor's reply to its caller waits for the hub's
   answer to its report: ``proc.actor_loop``), so the owner's ``__supervise__`` takes
   the failure before any message sent to the owner once a caller saw the error;
2. tells every client which actor addresses died (``actors_gone``), so that calls
   waiting on them fail at once with ``SupervisionError``;
3. awaits the owner's verdict: its ``__supervise__(failure)`` runs in its message
   loop; a truthy return handles it. Unhandled, it kills the owner (as in Monarch),
   whose own failure goes on up the same way, naming this one; an owner that survives
   it (``survive_unhandled_children``) leaves it to step 4;
4. otherwise announces it to clients as ``supervision`` (unhandled): a notebook shows
   it, and the next call on the affected mesh raises it (see ``client.supervision``).

Meshes an actor spawned are stopped when that actor is gone (its proc died or was
stopped, or its mesh was stopped): nobody is left to use them (see ``mesh_ops``).

Recovery from failures (``restart_procs``) is in ``restarts``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Awaitable

from ..protocol import agent_ops, envelope, events, hub_ops, proc_ops
from ..protocol.records import LOST_EXIT_CODE, exit_cause
from ..protocol.states import FailureKind
from ..wire.aio import AioEndpoint
from .announce import Announcer
from .logstore import LogStore
from .mesh_ops import MeshOps
from .records import ActorMeshRecord, HostRecord, ProcMeshRecord, ProcRecord, actor_mesh_key
from .registry import Registry

SUPERVISE_TIMEOUT_S = 10.0  # an owner busy longer than this leaves the failure unhandled
# How long an owner's proc has to say it queued a failure (it answers at once); under
# proc.actor_loop.REPORT_WAIT_S, so that a dying actor's callers still hear after the hub.
QUEUE_TIMEOUT_S = 1.0
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


class Supervision:
    """Failures of the procs and hosts of ``registry``: reported by host agents and
    actors, or found by the heartbeats and the allocator. The last stderr lines of a
    dying proc come from the log ``store``; ``meshes`` tells clients which actors died
    and stops the meshes they owned."""

    def __init__(self, registry: Registry, net: AioEndpoint, announcer: Announcer, store: LogStore,
                 meshes: MeshOps, says_handled: bool = True):
        """``says_handled``: note failures an owner handled on stderr (a retained hub's is
        hub.log; an ephemeral one's is its script's terminal, where a handled failure is
        no news)."""
        self._says_handled = says_handled
        self._registry = registry
        self._net = net
        self._announcer = announcer
        self._store = store
        self._meshes = meshes
        self._rejoining: set[str] = set()  # lost hosts being taken back (see host_back)

    # failures ------------------------------------------------------------------------
    async def proc_exited(self, header, message):
        found = self._registry.find_proc(header[agent_ops.PROC_ID])  # by index: no scan of every proc
        if found is None:
            return
        mesh, rank, proc = found
        # The pid too: a late report about a stopped mesh's proc must not hit the new
        # proc of the same id in a mesh spawned again under that name.
        if proc.pid != header.get("pid", proc.pid) or proc.exit_code is not None:
            return  # (or already failed: lost with its host, or stopped for a restart)
        proc.exit_code = header["returncode"]
        self._registry.save(proc)  # one journal line; a recovering hub learns exits from the agents anyway
        await self.procs_died([(mesh, rank, proc)], header.get("expected", False))

    async def host_lost(self, host: HostRecord, silent_s: float) -> None:
        """A host agent fell silent: its procs (which die with it) are failed."""
        host.lost = True
        self._net.forget(host.address)  # what is queued for it is moot; host_back talks to it again
        print(f"monarch_nb hub: host agent {host.host_id} (pid {host.pid}) silent for {silent_s:.1f} s; "
              "its procs are lost", file=sys.stderr)
        lost = self._lose_procs_of(host)
        why = f"was lost with its host {host.hostname} (agent pid {host.pid} silent for {silent_s:.1f} s)"
        await self.procs_died(lost, False, why, routers=_router_of(host, why))
        self._save_procs([proc for _, _, proc in lost])

    async def host_failed(self, host: HostRecord, cause: str) -> None:
        """``host`` is gone for ``cause``: it shows as failed in the health tree, and its
        live procs are failed (calls waiting on them raise ``SupervisionError``)."""
        host.cause = cause
        host.lost = True
        self._net.forget(host.address)  # gone for good: nothing queued for it may hold the hub's exit
        print(f"monarch_nb hub: host {host.host_id} ({host.node or host.hostname}) failed: {cause}", file=sys.stderr)
        lost = self._lose_procs_of(host)
        why = f"was lost with its host {host.node or host.hostname}: {cause}"
        await self.procs_died(lost, False, why, routers=_router_of(host, why))
        self._save_procs([proc for _, _, proc in lost])

    async def host_back(self, host: HostRecord) -> None:
        """The agent of ``host``, lost for its silence, is heard from again: ask it which
        procs still run (as a recovering hub does) and take the host back with them.
        Clients learn it from ``health_changed`` and ``actors_back`` (addresses of the
        actors live again); handles made from the registry since see them live."""
        if host.host_id in self._rejoining:
            return
        self._rejoining.add(host.host_id)
        try:
            reply = await self._net.request(host.address,
                                            {envelope.OP: agent_ops.ADOPT, agent_ops.HUB: self._net.address},
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
        changed = []
        for mesh, rank, proc in self._registry.procs_on(host.host_id):
            if proc.exit_code != LOST_EXIT_CODE:
                continue
            changed.append(proc)
            if proc.proc_id in live:
                proc.exit_code = None
                for record, i in self._registry.actors_on(mesh.name, rank):
                    back[record.addresses[i]] = (record.name, i)
            else:
                proc.exit_code = exited.get(proc.proc_id, LOST_EXIT_CODE)
                died.append(proc.proc_id)
        print(f"monarch_nb hub: host agent {host.host_id} (pid {host.pid}) is heard from again; taking it back"
              f" with {len(back)} live actor(s)" + (f"; procs {', '.join(died)} exited meanwhile" if died else ""),
              file=sys.stderr)
        self._save_procs(changed)
        await self._announcer.announce({envelope.OP: events.ACTORS_BACK, "actors": back})

    def _save_procs(self, procs: list[ProcRecord]) -> None:
        """A host's loss or return changed ``procs``: one journal line each (a host's
        ``lost`` and ``cause`` are not kept on disk: a recovering hub asks the agents),
        not a snapshot of the whole registry on the loop (3-6 ms at 2,048 procs, for
        each of a preempted job's hosts)."""
        if procs:
            self._registry.save(*procs)
        else:
            self._announcer.health_changed()

    def _lose_procs_of(self, host: HostRecord) -> list[tuple[ProcMeshRecord, int, ProcRecord]]:
        """Mark the live procs of ``host`` lost; returns them (mesh, rank, proc).
        O(procs of that host)."""
        lost = [(mesh, rank, proc) for mesh, rank, proc in self._registry.procs_on(host.host_id)
                if proc.exit_code is None]
        for _, _, proc in lost:
            proc.exit_code = LOST_EXIT_CODE
        return lost

    async def procs_died(self, deaths: list[tuple[ProcMeshRecord, int, ProcRecord]], expected: bool,
                         cause: str | None = None, routers: dict[str, str] | None = None) -> None:
        """Every client learns, in one event, which actors died with these procs and why,
        so that calls waiting on them fail now (``SupervisionError``, naming every dead
        rank) instead of never; each unexpected death then goes to its mesh's owner, or
        to the clients as unhandled. ``routers``: the host routers lost with them
        (address -> why), named in the same event (calls relayed through them fail)."""
        dying = [(mesh, rank, proc, self._death_cause(proc, expected, cause)) for mesh, rank, proc in deaths]
        failures = []
        for mesh, rank, proc, why in [] if expected else dying:
            hit = self._registry.actors_on(mesh.name, rank)
            # Monarch reports a proc's death as its actors' deaths (``The actor ... nested{...}``).
            report = "\n".join(record.gone_report(i, why, proc_exit=proc.exit_code) for record, i in hit)
            failures.append(({"kind": FailureKind.PROC_FAILED, "proc_mesh": mesh.name, "rank": rank,
                              "meshes": sorted({r.name for r, _ in hit}), "ranks": sorted({i for _, i in hit}),
                              "why": why, "endpoint": None, "report": report}, mesh.owner))
        verdicts = await asyncio.gather(*(self._tell_owner(failure, owner) for failure, owner in failures))
        gone = await self._meshes.actors_gone(dying, stopped=expected, routers=routers)
        for (failure, owner), verdict in zip(failures, verdicts):
            asyncio.ensure_future(self._settle(failure, owner, verdict))
        self._meshes.stop_orphans(gone)

    def _death_cause(self, proc: ProcRecord, expected: bool, cause: str | None) -> str:
        """Why ``proc`` is gone, as ``proc P (pid N on HOST) CAUSE; last stderr: ...``."""
        if cause is None:
            cause = proc.cause or ("was stopped" if expected else exit_cause(proc.exit_code))
            if proc.exit_code == -9 and not expected:  # SIGKILL: the usual sign of the OOM killer
                cause += " (by a person or program, or by the kernel's out-of-memory killer: see dmesg)"
        last = [] if expected else last_words([r[8] for r in self._store.last(proc.proc_id, "stderr", 80)])
        return f"{self._registry.describe(proc)} {cause}" + (f"; last stderr: {' | '.join(last)}" if last else "")

    async def actor_failed(self, header, message):
        """An actor's ``broadcast`` endpoint raised (the actor lives on), or the actor
        died (``ACTOR_DEAD``, for ``FAILED_CAUSE``). A dying actor asks for an answer,
        given once the owner has the failure queued and the clients were told: only
        then does the actor answer its caller (see ``proc.actor_loop``)."""
        proc_mesh = header.get(proc_ops.PROC, "").rpartition("/")[0]  # proc ids are PROC_MESH/RANK
        record = self._registry.actor_meshes.get(actor_mesh_key(proc_mesh, header["mesh"]))
        if record is None:
            return {}
        endpoint, rank = header[hub_ops.FAILED_ENDPOINT], header["rank"]
        if header.get(hub_ops.ACTOR_DEAD):
            await self.actor_died(record, rank, header[hub_ops.FAILED_CAUSE], endpoint,
                                  header.get(hub_ops.FAILED_TRACEBACK, ""))
            return {}
        why = f"{header['mesh']} rank {rank}: broadcast {endpoint} raised {header['error']}"
        failure = {"kind": FailureKind.ENDPOINT_FAILED, "proc_mesh": record.proc_mesh, "meshes": [record.name],
                   "ranks": [rank], "why": why, "endpoint": endpoint,
                   "traceback": header.get(hub_ops.FAILED_TRACEBACK, "")}
        await self.escalate(failure, record.owner)
        return {}

    async def actor_died(self, record: ActorMeshRecord, rank: int, cause: str, endpoint: str,
                         traceback: str) -> None:
        """Rank ``rank`` of actor mesh ``record`` died for ``cause`` (its proc lives on):
        the failure is queued for the mesh's owner, then every client learns it
        (``actors_gone``: calls to it fail at once), the meshes it owned are stopped,
        and, unhandled by the owner, the failure goes to the clients. Returns once the
        clients were told; the owner's verdict is not awaited (the owner may be the
        actor waiting for this mesh's spawn, or on a call to the dead actor)."""
        why = f"{record.name} rank {rank}: {cause}"
        record.died[str(rank)] = cause
        self._registry.save(record)  # (health shows it failed; a restart of its proc clears it)
        address = record.addresses[rank]
        report = record.gone_report(rank, cause)
        failure = {"kind": FailureKind.ACTOR_FAILED, "proc_mesh": record.proc_mesh, "meshes": [record.name],
                   "ranks": [rank], "why": why, "endpoint": endpoint, "traceback": traceback, "report": report}
        verdict = await self._tell_owner(failure, record.owner)
        await self._announcer.announce({envelope.OP: events.ACTORS_GONE, proc_ops.ALONE: True,
                                        "actors": {address: (record.name, rank, report)}})
        self._meshes.stop_orphans({address})
        if record.owner is None:
            await self._settle(failure, None, None)
        else:
            asyncio.ensure_future(self._settle(failure, record.owner, verdict))

    async def escalate(self, failure: dict, owner: dict | None) -> None:
        """Offer ``failure`` to ``owner`` (the actor that spawned the mesh); unhandled,
        it goes to the clients as ``supervision``."""
        await self._settle(failure, owner, await self._tell_owner(failure, owner))

    async def _tell_owner(self, failure: dict, owner: dict | None) -> Awaitable | None:
        """Put ``failure`` before the next message ``owner`` takes; returns, once it is
        there, the awaitable of the owner's verdict (``None`` without an owner), for
        :meth:`_settle`. The owner's proc queues it for the actor and says so at once,
        busy or not (``proc_ops.SUPERVISE_ACTOR``); an owner whose proc is unknown here
        gets it in its inbox (``supervise``), returning once sent."""
        if owner is None:
            return None
        try:
            return await self._queue_for(failure, owner)
        except Exception as e:  # (a bug, or the hub closing its sockets): the clients must still hear
            print(f"monarch_nb hub: could not tell {owner['mesh']} rank {owner['rank']} of a failure: "
                  f"{type(e).__name__}: {e}", file=sys.stderr)
            return None

    async def _queue_for(self, failure: dict, owner: dict) -> Awaitable:
        port, verdict = self._net.expect(SUPERVISE_TIMEOUT_S)
        try:
            found = self._registry.find_proc(owner.get("proc") or "")
            if found is not None and found[2].exit_code is None:
                try:
                    reply = await self._net.request(found[2].address, {
                        envelope.OP: proc_ops.SUPERVISE_ACTOR, proc_ops.MESH: owner["mesh"],
                        proc_ops.FAILURE: failure, proc_ops.VERDICT: [self._net.address, port]}, timeout=QUEUE_TIMEOUT_S)
                except asyncio.TimeoutError:
                    return verdict  # a stalled proc may queue it yet: not sent twice (the verdict may time out)
                if reply.header.get(proc_ops.QUEUED):
                    return verdict
            await self._net.send(owner["address"], {envelope.KIND: proc_ops.SUPERVISE, proc_ops.FAILURE: failure,
                                                    envelope.PORT: port, envelope.REPLY: self._net.address})
            return verdict
        except BaseException:
            verdict.close()
            self._net.forget_port(port)
            raise

    async def _settle(self, failure: dict, owner: dict | None, verdict: Awaitable | None) -> None:
        """Await ``owner``'s ``verdict`` on ``failure`` (see :meth:`_tell_owner`);
        unhandled, announce it to the clients."""
        if owner is not None and verdict is not None:
            outcome = await self._outcome(verdict)
            if outcome.get("handled") or outcome.get("owner_died"):
                verdict_text = "died of it" if outcome.get("owner_died") else "handled"
                if self._says_handled:
                    print(f"monarch_nb hub: {owner['mesh']} rank {owner['rank']} {verdict_text}: {failure['why']}",
                          file=sys.stderr)
                return  # the owner's own failure (ACTOR_FAILED) carries this one on up
            why = failure["why"] + (f"; not handled by {owner['mesh']} rank {owner['rank']}"
                                    + (f" ({outcome['error']})" if outcome.get("error") else ""))
            failure = {**failure, "why": why, "owner": owner}
        await self._announcer.announce({envelope.OP: events.SUPERVISION, "failure": failure})

    @staticmethod
    async def _outcome(verdict: Awaitable) -> dict:
        try:
            reply = await verdict
        except asyncio.TimeoutError:
            return {"handled": False, "error": f"the owner did not answer within {SUPERVISE_TIMEOUT_S} s"}
        return {"handled": bool(reply.header.get(proc_ops.HANDLED)), "error": reply.header.get(envelope.ERROR),
                "owner_died": bool(reply.header.get(proc_ops.OWNER_DIED))}


def _router_of(host: HostRecord, why: str) -> dict[str, str]:
    """``host``'s router (address -> ``why`` it is gone), as ``events.ROUTERS_GONE`` names it."""
    return {host.router: f"host agent {host.host_id} {why}"} if host.router else {}
