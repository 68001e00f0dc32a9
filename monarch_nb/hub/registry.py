"""The registry: the hosts, proc meshes and actor meshes of the cluster, and the state
files that keep them for a recovering hub (see ``state``).

Every service that changes the registry calls :meth:`Registry.save` afterwards, naming
the records it changed where it can: it announces ``health_changed`` and has the
change written to disk by a thread (``state_writer``), off the event loop. A change
costs one journal line in proportion to the record changed (a proc's exit: one proc),
not a rewrite of the whole state; ``save()`` without records (hosts, host order,
allocation, several records) takes a snapshot, at most once per pass of the event loop
however many ask, and the journal is folded into a snapshot once it outgrows the last
one. Replies that promise a change (a spawn's) await ``save``'s future: it is done
once the change is on disk.

What an event touches is found by id (``registry_index``): a proc by its id, a host's
procs, the actor meshes of a proc mesh, the meshes an actor owns. ``save`` with records
keeps those indexes up to date; ``save()`` has them built again at the next lookup.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from . import state
from .announce import Announcer
from .errors import HubError
from .records import ActorMeshRecord, HostRecord, ProcMeshRecord, ProcRecord
from .registry_index import RegistryIndex
from .state_writer import JOURNAL, SNAPSHOT, StateWriter

COMPACT_MIN_BYTES = 1 << 20  # a journal under this is never folded into a snapshot


class Registry:
    """What the hub knows, in memory and (unless ``ephemeral``) on disk under ``path``.

    ``allocator`` is asked for its spec (with its live allocation, e.g. a Slurm job id)
    at every snapshot; ``saved``: a recovering hub's loaded state, whose start time
    and mesh counter carry on (its hosts and meshes are taken over by adoption)."""

    def __init__(self, path: Path, ephemeral: bool, allocator, announcer: Announcer, saved: dict | None):
        self.path = path
        self.ephemeral = ephemeral
        self._allocator = allocator
        self._announcer = announcer
        self.hosts: dict[str, HostRecord] = {}
        self.host_order: list[str] = []  # the hosts of the cluster's own allocation
        # Allocations added while the cluster runs (Cluster.allocate), by name: each
        # allocator (Allocator protocol) holds its host ids.
        self.allocations: dict[str, Any] = {}
        self.proc_meshes: dict[str, ProcMeshRecord] = {}
        self.actor_meshes: dict[str, ActorMeshRecord] = {}  # by key: PROC_MESH/NAME
        self.started = saved["started"] if saved else time.time()
        self.mesh_counter = saved["mesh_counter"] if saved else 0
        self._payloads: dict[str, list[bytes]] = {}  # actor mesh constructor frames, for restarts
        self._index = RegistryIndex(lambda: (self.proc_meshes, self.actor_meshes))
        # Writing: a recovering hub journals on after its predecessor's snapshot.
        self._gen = saved.get("journal", 0) if saved else 0
        # The first save writes a snapshot: the journal follows it (a recovering hub's
        # predecessor may have left a line cut short at the end of its journal).
        self._snapshot_wanted = True
        self._lines: list[bytes] = []  # journal lines not yet handed to the writer
        self._waiters: list[asyncio.Future] = []  # saves not yet handed to the writer
        self._flush_soon = False
        self._journal_bytes = 0  # in the journal since the last snapshot
        self._compact_at = COMPACT_MIN_BYTES
        self.writer = None if ephemeral else StateWriter(path)

    def save(self, *changed: ProcRecord | ProcMeshRecord | ActorMeshRecord) -> asyncio.Future:
        """The registry changed: ``changed`` records (added, changed or removed from
        the registry; none: anything may have). Tells clients (coalesced) and has the
        change written off the event loop. Returns a future done once the change is on
        disk (or could not be written: a full disk only costs recoverability); never
        blocks. Call it on the event loop."""
        self._announcer.health_changed()
        if not changed:
            self._index.invalidate()
        for record in changed:
            if not isinstance(record, ProcRecord):  # (a proc's own fields changed: where it is did not)
                self._index.changed(record)
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        if self.writer is None:
            done.set_result(None)
            return done
        if not changed or self._snapshot_wanted:
            self._snapshot_wanted = True
        else:
            for record in changed:
                line = self._entry(record)
                if line is None:
                    self._snapshot_wanted = True
                    break
                self._lines.append(line)
        self._waiters.append(done)
        if not self._flush_soon:
            self._flush_soon = True
            loop.call_soon(self._flush)  # every save of this pass of the loop in one job
        return done

    def _entry(self, record) -> bytes | None:
        """The journal line saying what ``record``'s key now holds; None: a snapshot is needed."""
        counter = self.mesh_counter
        if isinstance(record, ProcRecord):
            found = self.find_proc(record.proc_id)
            if found is None:
                return b""  # no longer in the registry: its mesh's removal says it
            mesh, rank, proc = found
            return state.entry(state.PROC, counter, mesh=mesh.name, rank=rank, record=vars(proc))
        if isinstance(record, ProcMeshRecord):
            current = self.proc_meshes.get(record.name)
            if current is None:
                return state.entry(state.PROC_MESH_GONE, counter, name=record.name)
            return state.entry(state.PROC_MESH, counter, record=current.saved())
        if isinstance(record, ActorMeshRecord):
            now = self.actor_meshes.get(record.key)
            if now is None:
                return state.entry(state.ACTOR_MESH_GONE, counter, key=record.key)
            return state.entry(state.ACTOR_MESH, counter, record=now.saved())
        return None

    def _flush(self) -> None:
        self._flush_soon = False
        if self.writer is None:
            return
        waiters, self._waiters = self._waiters, []
        loop = asyncio.get_running_loop()

        def done() -> None:  # in the writer's thread
            try:
                loop.call_soon_threadsafe(_resolve, waiters)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

        if self._snapshot_wanted or self.writer.needs_snapshot or self._journal_bytes > self._compact_at:
            self._gen += 1
            text = state.snapshot(self.started, self.hosts, self.host_order, self.mesh_counter, self.proc_meshes,
                                  self.actor_meshes, self._allocator.spec(), self._gen,
                                  {name: {"spec": a.spec(), "hosts": list(a.host_ids)}
                                   for name, a in self.allocations.items()})
            self._snapshot_wanted = False
            self._lines = []  # the snapshot holds what they say
            self._journal_bytes = 0
            self._compact_at = max(COMPACT_MIN_BYTES, 2 * len(text))  # folding in costs O(1) a change
            self.writer.submit(SNAPSHOT, self._gen, text, done)
        else:
            lines = b"".join(self._lines)
            self._lines = []
            self._journal_bytes += len(lines)
            self.writer.submit(JOURNAL, self._gen, lines, done)

    def close(self) -> None:
        """Write what is pending and stop the writer; blocks for the disk (the hub's
        end: its directory is removed next, and nothing may be written into it then)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def next_number(self) -> int:
        """A number never given before in this cluster (for generated names and ids)."""
        self.mesh_counter += 1
        return self.mesh_counter

    # constructor payloads ----------------------------------------------------------------
    async def keep_payload(self, payload_id: str, frames: list[bytes]) -> None:
        """Keep an actor mesh's constructor frames for its restarts (a retained
        cluster's also in the state directory, for a recovering hub: written and
        fsynced by a thread, so the event loop does not wait for the disk however large
        the arguments). Returns once they are on disk. Raises ``OSError`` when they
        can't be written there (a full disk); nothing is kept."""
        if not self.ephemeral:
            await asyncio.get_running_loop().run_in_executor(None, state.save_payload, self.path, payload_id, frames)
        self._payloads[payload_id] = frames

    async def payload(self, payload_id: str) -> list[bytes] | None:
        """The constructor frames kept under ``payload_id`` (read by a thread when only
        the state directory has them: a recovered hub's), or ``None``."""
        frames = self._payloads.get(payload_id)
        if frames is None:
            frames = await asyncio.get_running_loop().run_in_executor(None, state.load_payload, self.path, payload_id)
        return frames

    def drop_payload(self, payload_id: str) -> None:
        self._payloads.pop(payload_id, None)
        state.drop_payload(self.path, payload_id)

    # queries -----------------------------------------------------------------------------
    def all_host_ids(self) -> list[str]:
        """Every host of the cluster: its own allocation's in order, then each added one's."""
        return self.host_order + [h for a in self.allocations.values() for h in a.host_ids]

    def live_procs(self) -> list[ProcRecord]:
        return [p for m in self.proc_meshes.values() for p in m.procs if p.exit_code is None]

    def procs_with_actors(self) -> set[str]:
        """The ids of the procs some actor mesh of the registry has an actor on."""
        found: set[str] = set()
        for record in self.actor_meshes.values():
            mesh = self.proc_meshes.get(record.proc_mesh)
            if mesh is not None:
                found.update(mesh.procs[r].proc_id for r in record.proc_ranks if r < len(mesh.procs))
        return found

    def find_proc(self, proc_id: str) -> tuple[ProcMeshRecord, int, ProcRecord] | None:
        """The proc mesh, rank and record of the proc ``proc_id``, if the registry holds
        it. O(1), by an index."""
        return self._index.proc(proc_id)

    def procs_on(self, host_id: str) -> list[tuple[ProcMeshRecord, int, ProcRecord]]:
        """Every proc of the registry on host ``host_id`` (mesh, rank, record), live or
        not. O(procs of that host)."""
        return self._index.procs_on(host_id)

    def find_actor_mesh(self, name: str) -> ActorMeshRecord | None:
        """The actor mesh with key ``name`` (``PROC_MESH/NAME``), or else the only one
        named ``name``; ``None`` when there is none. Raises ``HubError`` (``ValueError``)
        naming the keys when several proc meshes have one so named."""
        record = self.actor_meshes.get(name)
        if record is not None:
            return record
        named = [r for r in self.actor_meshes.values() if r.name == name]
        if len(named) > 1:
            keys = ", ".join(sorted(r.key for r in named))
            raise HubError(f"several proc meshes have an actor mesh named {name!r}: name one of {keys}", "ValueError")
        return named[0] if named else None

    def actors_on(self, proc_mesh: str, rank: int) -> list[tuple[ActorMeshRecord, int]]:
        """The actors living on rank ``rank`` of ``proc_mesh``: (actor mesh, actor rank).
        O(actor meshes of ``proc_mesh``)."""
        return self._index.actors_on(proc_mesh, rank)

    def actor_meshes_of(self, proc_mesh: str) -> list[ActorMeshRecord]:
        """The actor meshes spawned on the proc mesh named ``proc_mesh``."""
        return self._index.actor_meshes_of(proc_mesh)

    def owned_by(self, addresses: set[str]) -> list[ProcMeshRecord | ActorMeshRecord]:
        """The proc and actor meshes spawned by the actors at ``addresses`` (their owners).
        O(meshes they own)."""
        return self._index.owned_by(addresses)

    def describe(self, proc: ProcRecord) -> str:
        """``proc P (pid N on HOST)``, as failures name a proc."""
        host = self.hosts.get(proc.host_id)
        return f"proc {proc.proc_id} (pid {proc.pid} on {host.hostname if host else proc.host_id})"


def _resolve(waiters: list[asyncio.Future]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
