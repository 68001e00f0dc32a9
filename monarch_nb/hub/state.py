"""The hub's state on disk: the registry kept so a restarted hub can re-adopt the live
host agents and procs without losing a mesh.

Two files, both mode 0600: ``state.json``, a snapshot of hosts, proc meshes and actor
meshes, replaced atomically; and ``state.GEN.journal``, the changes made since that
snapshot (``GEN`` is the snapshot's ``journal`` field), one line per changed record
(a CRC-32, then JSON), appended. A reader applies the journal's lines to the snapshot in order. A
line cut short by a hub killed in the middle of a write is the journal's last line and
is ignored; what it said was never promised to anyone (see ``registry``). Snapshots
are taken now and then (compaction), so the journal stays shorter than the snapshot;
the journal of an older generation is left over only when a hub died between the two
steps of a compaction, and is ignored. Hosts, the host order and the allocator are in
snapshots only.

Each actor mesh's constructor payload (pickled class and arguments, plus out-of-band
buffers) goes once into ``spawn/ID.bin`` beside it, so the state stays small however
large the arguments are. The payload is kept as opaque bytes and is only ever
unpickled by procs, after the signature check of the message that carries it.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

from ..protocol import services
from .records import ActorMeshRecord, HostRecord, ProcMeshRecord, ProcRecord

STATE_FILE = "state.json"
VERSION = 1
_LEN = struct.Struct("!Q")

# Journal lines: {"change": CHANGE, "counter": mesh counter, ...} (a file format, not a wire op)
PROC_MESH = "proc_mesh"  # "record": a proc mesh's saved() record, added or changed
PROC_MESH_GONE = "proc_mesh_gone"  # "name"
ACTOR_MESH = "actor_mesh"  # "record": an actor mesh's saved() record
ACTOR_MESH_GONE = "actor_mesh_gone"  # "key"
PROC = "proc"  # "mesh", "rank", "record": one proc of a proc mesh (its exit, say)


def journal_name(gen: int) -> str:
    return f"state.{gen}.journal"


def snapshot(started: float, hosts: dict[str, HostRecord], host_order: list[str], counter: int,
             proc_meshes: dict[str, ProcMeshRecord], actor_meshes: dict[str, ActorMeshRecord],
             allocator: dict | None, gen: int, allocations: dict[str, dict] | None = None) -> bytes:
    """The whole registry as the text of ``state.json`` whose journal is generation
    ``gen``. ``allocator``: the allocator's spec, with its live allocation (e.g. a
    Slurm job id); ``allocations``: those added since the start, by name (each
    ``{"spec": ..., "hosts": [host ids]}``). Costs time in proportion to the registry:
    taken now and then only."""
    return json.dumps({
        "version": VERSION, "journal": gen, "started": started, "mesh_counter": counter,
        "host_order": host_order, "allocator": allocator, "allocations": allocations or {},
        "hosts": [h.saved() for h in hosts.values()],
        "proc_meshes": [m.saved() for m in proc_meshes.values()],
        "actor_meshes": [m.saved() for m in actor_meshes.values()]}).encode()


def entry(op: str, counter: int, **fields) -> bytes:
    """One journal line (with its newline): the CRC-32 of its JSON in 8 hex digits, a
    space, then the JSON of ``op`` and its fields; costs time in proportion to the one
    record it holds."""
    body = json.dumps({"change": op, "counter": counter, **fields}).encode()
    return b"%08x " % zlib.crc32(body) + body + b"\n"


def write_snapshot(path: Path, text: bytes) -> None:
    """Replace ``state.json`` under ``path`` with ``text`` atomically and durably (a
    hub killed meanwhile leaves the old one or the new one). Blocks for the disk's
    fsyncs: call it off the event loop. Raises ``OSError`` (a full disk)."""
    target = path / STATE_FILE
    tmp = path / f".{STATE_FILE}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path)  # the rename itself survives a power cut


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(path: Path) -> dict | None:
    """The saved registry as records (the snapshot with its journal applied), or
    ``None`` when there is no state file. Raises ``ValueError`` for a file written by
    an incompatible version. ``journal`` in the result: the generation it was read at."""
    try:
        with open(path / STATE_FILE) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    if data.get("version") != VERSION:
        raise ValueError(f"{path / STATE_FILE} has version {data.get('version')}, expected {VERSION}")
    gen = data.get("journal", 0)
    proc_meshes = {m["name"]: m for m in data["proc_meshes"]}
    actor_meshes = {ActorMeshRecord(**m).key: m for m in data["actor_meshes"]}
    counter = data["mesh_counter"]
    for line in read_journal(path / journal_name(gen)):
        counter = max(counter, line.get("counter", 0))
        op = line.get("change")
        if op == PROC_MESH:
            proc_meshes[line["record"]["name"]] = line["record"]
        elif op == PROC_MESH_GONE:
            proc_meshes.pop(line["name"], None)
        elif op == ACTOR_MESH:
            actor_meshes[ActorMeshRecord(**line["record"]).key] = line["record"]
        elif op == ACTOR_MESH_GONE:
            actor_meshes.pop(line["key"], None)
        elif op == PROC:
            mesh = proc_meshes.get(line["mesh"])
            if mesh is not None and 0 <= line["rank"] < len(mesh["procs"]):
                mesh["procs"][line["rank"]] = line["record"]
    return {
        "started": data["started"],
        "journal": gen,
        "mesh_counter": counter,
        "host_order": data["host_order"],
        "allocator": data.get("allocator"),
        "allocations": data.get("allocations", {}),
        "hosts": {h["host_id"]: HostRecord(**h) for h in data["hosts"]},
        "proc_meshes": {m["name"]: ProcMeshRecord(m["name"], m["extent"], [ProcRecord(**p) for p in m["procs"]],
                                                   m["created"], m.get("owner"), m.get("launch", {}),
                                                   m.get("rank_env", {}), m.get(services.SERVICE))
                        for m in proc_meshes.values()},
        "actor_meshes": {r.key: r for r in (ActorMeshRecord(**m) for m in actor_meshes.values())},
    }


def read_journal(file: Path) -> list[dict]:
    """The whole lines of a journal, in order. A last line without its newline (a hub
    killed while appending it), a line whose checksum does not match (a disk that lost
    or garbled what it was given) or that does not parse ends it: what follows was
    written after it, and is not applied without it. Lines without a checksum (a
    journal written before them) are read as they are."""
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        return []
    lines = []
    for raw in data.split(b"\n")[:-1]:  # what follows the last newline was cut short
        if not raw.startswith(b"{"):
            crc, _, raw = raw.partition(b" ")
            if len(crc) != 8 or crc != b"%08x" % zlib.crc32(raw):
                break
        try:
            lines.append(json.loads(raw))
        except ValueError:
            break
    return lines


def save_payload(path: Path, payload_id: str, frames: list[bytes]) -> None:
    """Write one actor mesh's constructor frames (body + buffers), length-prefixed.
    Blocks for the disk (an fsync): call it off the event loop. Raises ``OSError``."""
    folder = path / "spawn"
    folder.mkdir(mode=0o700, exist_ok=True)
    tmp = folder / f".{payload_id}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            for frame in frames:
                f.write(_LEN.pack(len(frame)))
                f.write(frame)
            f.flush()
            os.fsync(f.fileno())  # the journal line naming it is fsynced too: a power cut keeps both
        os.replace(tmp, folder / f"{payload_id}.bin")
    except BaseException:
        tmp.unlink(missing_ok=True)  # (a full disk: what was written of it is given back)
        raise


def drop_unreferenced_payloads(path: Path, keep: set[str], before: float) -> list[str]:
    """Remove the constructor payloads (and half-written ones) in ``spawn/`` that no
    payload id of ``keep`` names and that were written before ``before`` (epoch s: a
    spawn under way now may not be registered yet). A hub that died while an actor mesh
    was spawned left its payload, which nothing would remove until the cluster stopped
    (64 MB for a 64 MB argument). Returns the names removed."""
    removed = []
    for file in sorted((path / "spawn").glob("*")) if (path / "spawn").is_dir() else []:
        payload_id = file.name.lstrip(".").removesuffix(".bin").removesuffix(".tmp")
        try:
            if payload_id not in keep and file.stat().st_mtime < before:
                file.unlink()
                removed.append(file.name)
        except FileNotFoundError:
            pass
    return removed


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
