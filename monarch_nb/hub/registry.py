"""What the hub knows: hosts, proc meshes and actor meshes (plain records)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class HostRecord:
    host_id: str
    address: str
    pid: int
    hostname: str
    last_seen: float = field(default_factory=time.monotonic)


@dataclass
class ProcRecord:
    proc_id: str
    host_id: str
    address: str
    pid: int
    exit_code: int | None = None  # set when the proc has exited


@dataclass
class ProcMeshRecord:
    name: str
    extent: dict[str, int]
    procs: list[ProcRecord]  # in rank order
    created: float = field(default_factory=time.time)

    def public(self) -> dict:
        return {"name": self.name, "extent": self.extent, "created": self.created,
                "procs": [vars(p) for p in self.procs]}


@dataclass
class ActorMeshRecord:
    name: str
    proc_mesh: str
    proc_ranks: list[int]  # base rank in the proc mesh of each actor, in actor rank order
    extent: dict[str, int]
    class_name: str
    endpoints: dict[str, bool]
    addresses: list[str]
    spawn_body: bytes  # pickled (class, args, kwargs), kept opaque for respawns
    created: float = field(default_factory=time.time)

    def public(self) -> dict:
        return {"name": self.name, "proc_mesh": self.proc_mesh, "proc_ranks": self.proc_ranks,
                "extent": self.extent, "class_name": self.class_name, "endpoints": self.endpoints,
                "addresses": self.addresses, "created": self.created}
