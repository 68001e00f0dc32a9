"""The registry: the hosts, proc meshes and actor meshes of the cluster, and the state
file that keeps them for a recovering hub (see ``state``).

Every service that changes the registry calls :meth:`Registry.save` afterwards: it
writes the state file (a retained cluster's) and announces ``health_changed``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from . import state
from .announce import Announcer
from .errors import HubError
from .records import ActorMeshRecord, HostRecord, ProcMeshRecord, ProcRecord


class Registry:
    """What the hub knows, in memory and (unless ``ephemeral``) on disk under ``path``.

    ``allocator`` is asked for its spec (with its live allocation, e.g. a Slurm job id)
    on every save; ``saved``: a recovering hub's loaded state file, whose start time
    and mesh counter carry on (its hosts and meshes are taken over by adoption)."""

    def __init__(self, path: Path, ephemeral: bool, allocator, announcer: Announcer, saved: dict | None):
        self.path = path
        self.ephemeral = ephemeral
        self._allocator = allocator
        self._announcer = announcer
        self.hosts: dict[str, HostRecord] = {}
        self.host_order: list[str] = []
        self.proc_meshes: dict[str, ProcMeshRecord] = {}
        self.actor_meshes: dict[str, ActorMeshRecord] = {}  # by key: PROC_MESH/NAME
        self.started = saved["started"] if saved else time.time()
        self.mesh_counter = saved["mesh_counter"] if saved else 0
        self._payloads: dict[str, list[bytes]] = {}  # actor mesh constructor frames, for restarts
        self._state_failing = False  # the last state file write failed (said once in hub.log)

    def save(self) -> None:
        """The registry changed: write the state file and tell clients (coalesced)."""
        self._announcer.health_changed()
        if self.ephemeral:
            return
        # On the event loop, not in a thread: a reply sent after this promises that a
        # recovering hub finds the change. A full disk only costs recoverability.
        try:
            state.save(self.path, self.started, self.hosts, self.host_order, self.mesh_counter,
                       self.proc_meshes, self.actor_meshes, allocator=self._allocator.spec())
        except OSError as e:
            if not self._state_failing:
                print(f"monarch_nb hub: could not write the state file ({e}); the cluster runs on, but a hub "
                      "recovered after this one dies may miss the latest changes", file=sys.stderr)
            self._state_failing = True
        else:
            if self._state_failing:
                print("monarch_nb hub: writing the state file again", file=sys.stderr)
            self._state_failing = False

    def next_number(self) -> int:
        """A number never given before in this cluster (for generated names and ids)."""
        self.mesh_counter += 1
        return self.mesh_counter

    # constructor payloads ----------------------------------------------------------------
    def keep_payload(self, payload_id: str, frames: list[bytes]) -> None:
        """Keep an actor mesh's constructor frames for its restarts (a retained
        cluster's also in the state directory, for a recovering hub). Raises
        ``OSError`` when they can't be written there (a full disk); nothing is kept."""
        if not self.ephemeral:
            state.save_payload(self.path, payload_id, frames)
        self._payloads[payload_id] = frames

    def payload(self, payload_id: str) -> list[bytes] | None:
        return self._payloads.get(payload_id) or state.load_payload(self.path, payload_id)

    def drop_payload(self, payload_id: str) -> None:
        self._payloads.pop(payload_id, None)
        state.drop_payload(self.path, payload_id)

    # queries -----------------------------------------------------------------------------
    def live_procs(self) -> list[ProcRecord]:
        return [p for m in self.proc_meshes.values() for p in m.procs if p.exit_code is None]

    def find_proc(self, proc_id: str) -> tuple[ProcMeshRecord, int, ProcRecord] | None:
        """The proc mesh, rank and record of the proc ``proc_id``, if the registry holds it."""
        for mesh in self.proc_meshes.values():
            for rank, proc in enumerate(mesh.procs):
                if proc.proc_id == proc_id:
                    return mesh, rank, proc
        return None

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
        """The actors living on rank ``rank`` of ``proc_mesh``: (actor mesh, actor rank)."""
        return [(record, record.proc_ranks.index(rank)) for record in self.actor_meshes.values()
                if record.proc_mesh == proc_mesh and rank in record.proc_ranks]

    def describe(self, proc: ProcRecord) -> str:
        """``proc P (pid N on HOST)``, as failures name a proc."""
        host = self.hosts.get(proc.host_id)
        return f"proc {proc.proc_id} (pid {proc.pid} on {host.hostname if host else proc.host_id})"
