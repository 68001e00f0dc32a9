"""Indexes over the registry's meshes, so that what an event touches is found by id:
a proc by its id, the procs of a host, the actor meshes of a proc mesh (with each
actor's rank by its proc's rank), the meshes an actor owns. Work per event is then
O(1) or O(the meshes it touches), not O(every proc of the cluster).

The registry's dicts stay the truth: an index entry names the record it was made from
and is checked against the dicts at each lookup, so an entry left behind by a mesh
stopped or replaced since is never returned (it reads as absent). Entries are added
and removed per record as the registry is told of changes (``Registry.save`` with
records); a change it is not told the records of (``save()``, a dict replaced
wholesale) has everything indexed again at the next lookup (O(all), at host events and
at a hub's start only).
"""

from __future__ import annotations

from .records import ActorMeshRecord, ProcMeshRecord, ProcRecord


class RegistryIndex:
    """Indexes over ``proc_meshes`` (name -> record) and ``actor_meshes`` (key ->
    record), read through ``tables()`` (a callable: the registry's dicts may be
    replaced, e.g. by a recovering hub's adoption)."""

    def __init__(self, tables):
        self._tables = tables
        self._procs: dict[str, tuple[ProcMeshRecord, int, str]] = {}  # proc id -> (proc mesh, rank, host id)
        self._by_host: dict[str, set[str]] = {}  # host id -> proc ids
        # proc mesh name -> actor mesh key -> (record, proc rank -> actor rank)
        self._actors: dict[str, dict[str, tuple[ActorMeshRecord, dict[int, int]]]] = {}
        self._owned: dict[str, dict[int, ProcMeshRecord | ActorMeshRecord]] = {}  # owner address -> id -> mesh
        self._of: tuple[int, int] | None = None  # ids of the dicts indexed; None: index everything again

    # told of changes ---------------------------------------------------------------
    def changed(self, record: ProcMeshRecord | ActorMeshRecord) -> None:
        """``record`` was added to, changed in (procs replaced by a restart, actors'
        addresses) or removed from the registry: its entries follow. O(its size)."""
        proc_meshes, actor_meshes = self._tables()
        if isinstance(record, ProcMeshRecord):
            self._index_procs(record, present=proc_meshes.get(record.name) is record)
        else:
            self._index_actors(record, present=actor_meshes.get(record.key) is record)

    def invalidate(self) -> None:
        """Anything may have changed: index everything again at the next lookup."""
        self._of = None

    # lookups -----------------------------------------------------------------------
    def proc(self, proc_id: str) -> tuple[ProcMeshRecord, int, ProcRecord] | None:
        """The proc mesh, rank and record of ``proc_id``; None when the registry has no such proc."""
        self._fresh()
        hit = self._procs.get(proc_id)
        return None if hit is None else self._live(proc_id, hit[0], hit[1])

    def procs_on(self, host_id: str) -> list[tuple[ProcMeshRecord, int, ProcRecord]]:
        """Every proc of the registry on host ``host_id`` (mesh, rank, record), live or not."""
        self._fresh()
        found = [self._live(proc_id, *self._procs[proc_id][:2]) for proc_id in self._by_host.get(host_id, ())]
        return sorted((hit for hit in found if hit is not None and hit[2].host_id == host_id),
                      key=lambda hit: (hit[0].name, hit[1]))  # (in a stable order, for messages and tests)

    def actors_on(self, proc_mesh: str, rank: int) -> list[tuple[ActorMeshRecord, int]]:
        """The actors living on rank ``rank`` of ``proc_mesh``: (actor mesh, actor rank)."""
        return [(record, ranks[rank]) for record, ranks in self._actor_meshes(proc_mesh) if rank in ranks]

    def actor_meshes_of(self, proc_mesh: str) -> list[ActorMeshRecord]:
        """The actor meshes spawned on ``proc_mesh``."""
        return [record for record, _ in self._actor_meshes(proc_mesh)]

    def owned_by(self, addresses: set[str]) -> list[ProcMeshRecord | ActorMeshRecord]:
        """The meshes (proc and actor) whose owner is the actor at one of ``addresses``."""
        self._fresh()
        proc_meshes, actor_meshes = self._tables()
        owned = [mesh for address in addresses for mesh in self._owned.get(address, {}).values()]
        return [m for m in owned if (proc_meshes.get(m.name) if isinstance(m, ProcMeshRecord)
                                     else actor_meshes.get(m.key)) is m]

    # inside ------------------------------------------------------------------------
    def _actor_meshes(self, proc_mesh: str) -> list[tuple[ActorMeshRecord, dict[int, int]]]:
        self._fresh()
        _, actor_meshes = self._tables()
        return [(record, ranks) for key, (record, ranks) in self._actors.get(proc_mesh, {}).items()
                if actor_meshes.get(key) is record]

    def _live(self, proc_id: str, mesh: ProcMeshRecord, rank: int) -> tuple[ProcMeshRecord, int, ProcRecord] | None:
        proc_meshes, _ = self._tables()
        if proc_meshes.get(mesh.name) is not mesh or rank >= len(mesh.procs) or mesh.procs[rank].proc_id != proc_id:
            return None  # the mesh was stopped or replaced since
        return mesh, rank, mesh.procs[rank]

    def _fresh(self) -> None:
        proc_meshes, actor_meshes = self._tables()
        if self._of == (id(proc_meshes), id(actor_meshes)):
            return
        self._procs, self._by_host, self._actors, self._owned = {}, {}, {}, {}
        for mesh in proc_meshes.values():
            self._index_procs(mesh, present=True)
        for record in actor_meshes.values():
            self._index_actors(record, present=True)
        self._of = (id(proc_meshes), id(actor_meshes))

    def _index_procs(self, mesh: ProcMeshRecord, present: bool) -> None:
        for rank, proc in enumerate(mesh.procs):
            old = self._procs.get(proc.proc_id)
            if old is not None and old[0] is mesh:  # this mesh's entry (a restart may have moved the proc)
                self._by_host[old[2]].discard(proc.proc_id)
                if not self._by_host[old[2]]:
                    del self._by_host[old[2]]
                del self._procs[proc.proc_id]
            if present:
                self._procs[proc.proc_id] = (mesh, rank, proc.host_id)
                self._by_host.setdefault(proc.host_id, set()).add(proc.proc_id)
        self._own(mesh, present)

    def _index_actors(self, record: ActorMeshRecord, present: bool) -> None:
        of_mesh = self._actors.setdefault(record.proc_mesh, {})
        old = of_mesh.get(record.key)
        if old is not None and (old[0] is record or present):
            del of_mesh[record.key]
            self._own(old[0], False)
        if present:
            of_mesh[record.key] = (record, {r: i for i, r in enumerate(record.proc_ranks)})
            self._own(record, True)
        if not of_mesh:
            del self._actors[record.proc_mesh]

    def _own(self, mesh: ProcMeshRecord | ActorMeshRecord, present: bool) -> None:
        address = (mesh.owner or {}).get("address")
        if address is None:
            return
        owned = self._owned.setdefault(address, {})
        if present:
            owned[id(mesh)] = mesh
        else:
            owned.pop(id(mesh), None)
            if not owned:
                del self._owned[address]
