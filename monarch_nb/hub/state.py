"""The hub's state file: the registry written to disk so a restarted hub can re-adopt
the live host agents and procs without losing a mesh.

``state.json`` (mode 0600, replaced atomically on every registry change) holds hosts,
proc meshes and actor meshes. Each actor mesh's constructor payload (pickled class and
arguments, plus out-of-band buffers) goes once into ``spawn/ID.bin`` beside it, so the
JSON stays small however large the arguments are. The payload is kept as opaque bytes
and is only ever unpickled by procs, after the signature check of the message that
carries it.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from .. import cluster_dir
from .records import ActorMeshRecord, HostRecord, ProcMeshRecord, ProcRecord

STATE_FILE = "state.json"
VERSION = 1
_LEN = struct.Struct("!Q")


def save(path: Path, started: float, hosts: dict[str, HostRecord], host_order: list[str], counter: int,
         proc_meshes: dict[str, ProcMeshRecord], actor_meshes: dict[str, ActorMeshRecord],
         allocator: dict | None = None) -> None:
    """``allocator``: the allocator's spec, with its live allocation (e.g. a Slurm job id)."""
    cluster_dir.write_json(path / STATE_FILE, {
        "version": VERSION, "started": started, "mesh_counter": counter, "host_order": host_order,
        "allocator": allocator,
        "hosts": [h.saved() for h in hosts.values()],
        "proc_meshes": [m.saved() for m in proc_meshes.values()],
        "actor_meshes": [m.saved() for m in actor_meshes.values()]})


def load(path: Path) -> dict | None:
    """The saved registry as records, or ``None`` when there is no state file.
    Raises ``ValueError`` for a file written by an incompatible version."""
    try:
        with open(path / STATE_FILE) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    if data.get("version") != VERSION:
        raise ValueError(f"{path / STATE_FILE} has version {data.get('version')}, expected {VERSION}")
    return {
        "started": data["started"],
        "mesh_counter": data["mesh_counter"],
        "host_order": data["host_order"],
        "allocator": data.get("allocator"),
        "hosts": {h["host_id"]: HostRecord(**h) for h in data["hosts"]},
        "proc_meshes": {m["name"]: ProcMeshRecord(m["name"], m["extent"], [ProcRecord(**p) for p in m["procs"]],
                                                   m["created"], m.get("owner"), m.get("launch", {}),
                                                   m.get("rank_env", {})) for m in data["proc_meshes"]},
        "actor_meshes": {r.key: r for r in (ActorMeshRecord(**m) for m in data["actor_meshes"])},
    }


def save_payload(path: Path, payload_id: str, frames: list[bytes]) -> None:
    """Write one actor mesh's constructor frames (body + buffers), length-prefixed."""
    folder = path / "spawn"
    folder.mkdir(mode=0o700, exist_ok=True)
    tmp = folder / f".{payload_id}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            for frame in frames:
                f.write(_LEN.pack(len(frame)))
                f.write(frame)
        os.replace(tmp, folder / f"{payload_id}.bin")
    except BaseException:
        tmp.unlink(missing_ok=True)  # (a full disk: what was written of it is given back)
        raise


def drop_payload(path: Path, payload_id: str) -> None:
    try:
        (path / "spawn" / f"{payload_id}.bin").unlink()
    except FileNotFoundError:
        pass


def load_payload(path: Path, payload_id: str) -> list[bytes] | None:
    """The frames :func:`save_payload` wrote, or ``None`` when there is no such file."""
    try:
        data = (path / "spawn" / f"{payload_id}.bin").read_bytes()
    except FileNotFoundError:
        return None
    frames, at = [], 0
    while at < len(data):
        (size,) = _LEN.unpack_from(data, at)
        at += _LEN.size
        frames.append(data[at:at + size])
        at += size
    return frames
