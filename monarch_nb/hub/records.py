"""The records of what the hub knows: hosts, proc meshes, actor meshes and clients.

``public()`` is what clients are told; ``saved()`` what goes into the state file.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from ..errors import actor_gone_report, actor_name
from ..protocol import services
from ..protocol.records import proc_failure_status
from ..starvation import Watched


@dataclass
class HostRecord:
    host_id: str
    address: str
    pid: int
    hostname: str
    last_seen: float = field(default_factory=time.monotonic)  # monotonic: not saved
    lost: bool = False  # fell silent: its procs were failed
    node: str = ""  # the allocator's name for it (a Slurm node); hostnames may repeat
    cause: str = ""  # why it failed, when its allocation ended (a cancelled Slurm job)
    dropped_frames: int = 0  # frame sets its agent dropped (bad signature, replay, malformed), as it last said
    heartbeats: int = 0  # heartbeats heard from its agent by this hub
    # Its agent's waits for a CPU, when on this hub's machine (see ``heartbeats``). Not saved.
    cpu: Watched = field(default_factory=Watched)
    starved: int = 0  # silences past the timeout excused because the agent was waiting for a CPU
    gpus: list = field(default_factory=list)  # its GPU inventory as it reported it (protocol.gpus records)
    router: str = ""  # its router's inbox (host.router); "" for an agent that runs none

    def public(self) -> dict:
        return {**self.saved(), "lost": self.lost, "cause": self.cause, "heartbeats": self.heartbeats,
                "silent_s": round(time.monotonic() - self.last_seen, 3), "dropped_frames": self.dropped_frames,
                "starved": self.starved}

    def saved(self) -> dict:
        return {"host_id": self.host_id, "address": self.address, "pid": self.pid, "hostname": self.hostname,
                "node": self.node, "gpus": self.gpus, "router": self.router}


@dataclass
class ProcRecord:
    proc_id: str
    host_id: str
    address: str
    pid: int
    exit_code: int | None = None  # set when the proc has exited
    cause: str | None = None  # why the hub stopped it, when that says more than the exit code


@dataclass
class ProcMeshRecord:
    name: str
    extent: dict[str, int]
    procs: list[ProcRecord]  # in rank order
    created: float = field(default_factory=time.time)
    owner: dict | None = None  # the actor that spawned it (mesh, rank, address); None: a client
    launch: dict = field(default_factory=dict)  # env, cwd, python of the spawn: restarts reuse them
    rank_env: dict = field(default_factory=dict)  # str(rank) -> env set in that proc since (torch's)
    service: dict | None = None  # the service it is a replica of (protocol.services), kept as given

    def public(self) -> dict:
        return {"name": self.name, "extent": self.extent, "created": self.created,
                "procs": [vars(p) for p in self.procs], "owner": self.owner, "launch": self.launch,
                "rank_env": self.rank_env, services.SERVICE: self.service}

    saved = public


def actor_mesh_key(proc_mesh: str, name: str) -> str:
    """An actor mesh's key in the registry, ``PROC_MESH/NAME``: names are scoped to their
    proc mesh (as in Monarch), and proc mesh names hold no ``/``."""
    return f"{proc_mesh}/{name}"


@dataclass
class ActorMeshRecord:
    name: str  # unique within its proc mesh only; ``key`` is unique in the cluster
    proc_mesh: str
    proc_ranks: list[int]  # base rank in the proc mesh of each actor, in actor rank order
    extent: dict[str, int]
    class_name: str
    endpoints: dict[str, bool]
    methods: list[str]  # public non-endpoint methods, for the "not an endpoint" hint
    addresses: list[str]
    payload_id: str  # the constructor payload is kept in the state dir under this id
    created: float = field(default_factory=time.time)
    owner: dict | None = None  # the actor that spawned it (mesh, rank, address); None: a client
    digests: dict | None = None  # {"code", "args"} of its construction (client.spawn_digest); None: not known
    # rank (a string: it is kept as JSON) -> why, for its actors dead while their procs
    # live (an __init__ that raised, an endpoint's SystemExit): health() shows them failed
    died: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return actor_mesh_key(self.proc_mesh, self.name)

    def gone_report(self, rank: int, cause: str, stopped: bool = False, proc_exit: int | None = None) -> str:
        """Why calls to actor ``rank`` fail: it failed for ``cause``, or was ``stopped``.
        ``proc_exit``: the exit code of its proc, when that proc's death is the cause:
        Monarch's status of it (``Killed(sig=9)``) then leads ``cause``."""
        status = None if stopped else proc_failure_status(proc_exit)
        why = f"{status}; {cause}" if status else cause
        return actor_gone_report(actor_name(self.class_name, self.name, self.extent, rank),
                                 f"{self.name} rank {rank}: {why}", stopped)

    def public(self) -> dict:
        return {**asdict(self), "key": self.key}

    def saved(self) -> dict:
        # The key follows from proc_mesh and name (state files before it load too). A
        # shallow dict, not asdict's deep copy: it is encoded at once, on the hub's loop
        # (a snapshot of 2,048 actor meshes of 8: 4 ms instead of 12).
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass
class ClientRecord:
    client_id: str
    pid: int
    hostname: str
    label: str  # e.g. the script or kernel it runs in
    log_address: str | None = None  # where this client wants the lines its calls caused
    log_seq: int = 0  # batches of lines forwarded to it so far
    wants_lines: bool = True  # False for a proc acting as a client: it gets events only
    connected: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.monotonic)

    def public(self) -> dict:
        return {"client_id": self.client_id, "pid": self.pid, "hostname": self.hostname, "label": self.label,
                "connected": self.connected}
