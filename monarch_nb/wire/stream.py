"""Large frames to another host, sent ahead of their frame set in chunks hashed as they go.

A frame set is signed over the keyed BLAKE3 digest of each large frame (``wire.frames``),
and zmq hands a multipart message to the receiver only once all of it is in. Sent as one
message, a 64 MiB frame is hashed by the sender before any of it leaves and by the
receiver after all of it arrived: two passes in series with the transfer (between two
network namespaces of the 2-core VM here, 0.70-0.74x a raw zmq stream; the same without
any hashing, 0.96x).

So a frame of ``MIN_BYTES`` or more that stays on the socket is sent first, as messages
of ``CHUNK_BYTES`` (``[head, chunk]``: two frames, where a frame set has three or more)
on the socket its frame set then follows on: the sender hashes a chunk while zmq's I/O
thread sends it, and the receiver (:class:`Streams`, one per inbox) hashes each chunk
and copies it to its place while the next one travels. The frame set comes last, its
descriptor (``wire.shm``) naming each such frame ``stream <id>``; the receiver takes the
assembled value and its digest from :class:`Streams`, and the signature check of the
frame set covers them as if the frame had come inside it: nothing is unpickled before
that check. Chunks are unsigned: a forged, reordered or replayed one changes the digest
or breaks the stream, so the frame set fails its check and is dropped. The copy costs
less than it saves: the value is written once, into pages faulted in ahead in bulk,
where one large message lands in a buffer zmq allocates and faults in page by page
(64 MiB: 0.83-0.90x; 256 MiB: 0.93x against 0.77x as one message; 1 GiB: median of 10,
0.79-0.83x against 0.75x; ``bench/bench_multihost.py``).

What an inbox holds for frame sets not yet arrived is bounded: streams in progress (a
sender that died half way, junk from anyone who can connect) are dropped when they go
``STALE_S`` seconds without a chunk, or, oldest first, when they would hold more than
``frames.max_message_bytes()`` in all.
"""

from __future__ import annotations

import mmap
import struct
import time
from typing import Any, Callable

import blake3
import zmq

from . import fill

MARKER = b"MNBSTRM1"
# Bytes per chunk message: small enough that hashing and copying one overlaps the next
# one's trip and finds it in the cache, large enough that the per-message cost vanishes,
# and under glibc's mmap threshold, so that zmq's buffers for them are reused, not
# faulted in anew. Between two network namespaces of the 2-core VM here (64 MiB, 12
# interleaved blocks): 512 KiB 0.81x a raw zmq stream, 1 MiB 0.82x, 2 MiB 0.85x, 4 MiB
# 0.83x; hashed on the receiving thread, not BLAKE3's own threads, which took 0.82x at
# 2 MiB (the cores are busy moving the bytes). One message: 0.71x.
CHUNK_BYTES = 2 << 20
# Frames this large are streamed (two chunks at least: with one, nothing overlaps).
MIN_BYTES = 2 * CHUNK_BYTES
# How far ahead of the chunks the receiver faults in the value's pages, in one system
# call (``fill.prefault``; a fault per page, taken as the copy comes, cost more). Two
# namespaces of the 2-core VM here, 12 interleaved blocks: 8 MiB ahead 0.83-0.90x a raw
# zmq stream at 64 MiB, 0.99x at 1 GiB; 64 MiB ahead 0.78-0.85x, 1.00x; 256 MiB ahead
# 0.57x at 1 GiB; page by page 0.82-0.85x, 0.54x.
PREFAULT_BYTES = 8 << 20
STALE_S = 60.0

_HEAD = struct.Struct("<16scQQ")  # stream id, kind letter (wire.shm.kind_of), offset, total size; then the cluster id
_SNDMORE = int(zmq.SNDMORE)


class StreamError(Exception):
    """A chunk or a frame set's reference to a stream that does not add up."""


def send(sock: zmq.Socket, trackers: list, cluster_id: bytes, stream_id: bytes, kind: str, view: memoryview,
         key: bytes | None) -> bytes | None:
    """Send ``view`` (one frame of a frame set, ``kind`` as ``wire.shm.kind_of`` says) as
    chunk messages of stream ``stream_id`` (16 bytes) on ``sock``, without copying it;
    appends to ``trackers`` what tells when the chunks have left. Returns the keyed
    BLAKE3 digest of ``view`` under ``key``, made chunk by chunk while zmq's I/O thread
    sends them, or ``None`` with no ``key`` (the frame set was signed already)."""
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    size = view.nbytes
    hasher = blake3.blake3(key=key) if key is not None else None
    letter = kind.encode()
    tracker = None
    for at in range(0, size, CHUNK_BYTES):
        chunk = view[at:at + CHUNK_BYTES]
        sock.send(MARKER + _HEAD.pack(stream_id, letter, at, size) + cluster_id, _SNDMORE)
        tracker = sock.send(chunk, copy=False, track=True)
        if hasher is not None:
            hasher.update(chunk)
    if tracker is not None:
        trackers.append(tracker)  # (one connection: the last chunk leaves last)
    return hasher.digest() if hasher is not None else None


class _Stream:
    __slots__ = ("keys", "kind", "size", "received", "faulted", "value", "view", "hasher", "touched")

    def __init__(self, keys: Any, kind: bytes, size: int):
        self.keys, self.kind, self.size, self.received, self.faulted = keys, kind, size, 0, 0
        self.value, self.view = _allocate(kind, size)
        self.hasher = blake3.blake3(key=keys.blake3)
        self.touched = time.monotonic()

    def put(self, offset: int, chunk: memoryview) -> None:
        end = offset + chunk.nbytes
        if end > self.faulted:
            ahead = max(end, min(self.size, self.faulted + PREFAULT_BYTES)) - self.faulted
            fill.prefault(self.view, self.faulted, ahead)
            self.faulted += ahead
        self.hasher.update(chunk)
        self.view[offset:end] = chunk
        self.received = end
        self.touched = time.monotonic()


def _allocate(kind: bytes, size: int) -> tuple[Any, memoryview]:
    """The object a frame of ``kind`` arrives as, and a writable byte view of it: a new
    ``bytes`` filled in place (``wire.fill``), a ``bytearray``, or (anything else) a
    private anonymous mapping, whose pages cost nothing until faulted in."""
    if kind == b"b":
        fresh = fill.fresh_bytes(size)
        if fresh is not None:
            return fresh
    if kind in (b"a", b"b"):  # (b: this interpreter's bytes layout is unknown; converted on taking)
        value = bytearray(size)
        return value, memoryview(value)
    # Private: Python's default for an anonymous mapping is shared, which the kernel backs
    # as shmem (1 GiB here: 430 ms to fault in and fill, 88 ms to unmap; private 345 and 24).
    mapped = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return mapped, memoryview(mapped)


class Streams:
    """The streams one inbox is receiving (used by that inbox's thread only)."""

    def __init__(self, budget: Callable[[], int]):
        self._budget = budget  # most bytes held in all, read when a stream starts
        self._open: dict[bytes, _Stream] = {}  # stream id -> stream, oldest first

    def absorb(self, frames: list, keys_of: Callable[[bytes], Any]) -> None:
        """Take one chunk message: hash it and copy it to its place. Raises
        :class:`StreamError` for one that is not a chunk, of an unknown cluster, or out
        of order (its stream is dropped)."""
        head = bytes(frames[0])
        if not head.startswith(MARKER) or len(head) < len(MARKER) + _HEAD.size:
            raise StreamError("not a monarch_nb frame set or chunk")
        stream_id, kind, offset, size = _HEAD.unpack_from(head, len(MARKER))
        chunk = memoryview(frames[1]).cast("B")
        stream = self._open.get(stream_id)
        if stream is None:
            keys = keys_of(head[len(MARKER) + _HEAD.size:])
            if keys is None:
                raise StreamError("chunk of an unknown cluster")
            if offset != 0 or size < MIN_BYTES:
                raise StreamError("chunk of a stream that did not start")
            self._make_room(size)
            stream = self._open[stream_id] = _Stream(keys, kind, size)
        if offset != stream.received or offset + chunk.nbytes > stream.size or size != stream.size \
                or not chunk.nbytes:
            del self._open[stream_id]
            raise StreamError(f"chunk at byte {offset} of a stream that has {stream.received} of {stream.size}")
        stream.put(offset, chunk)

    def take(self, stream_id: bytes, size: int) -> tuple[Any, Any, bytes]:
        """The complete stream ``stream_id`` of ``size`` bytes, no longer held here:
        ``(value, keys it was hashed with, digest)``. Raises :class:`StreamError` when it
        is not here, not complete or of another size."""
        stream = self._open.pop(stream_id, None)
        if stream is None or stream.received != stream.size or stream.size != size:
            raise StreamError(f"stream {stream_id.hex()} is missing or incomplete")
        stream.view.release()
        value = stream.value
        if stream.kind == b"b" and type(value) is not bytes:
            value = bytes(value)
        return value, stream.keys, stream.hasher.digest()

    def _make_room(self, size: int) -> None:
        now = time.monotonic()
        for stream_id in [s for s, stream in self._open.items() if now - stream.touched > STALE_S]:
            del self._open[stream_id]
        budget = self._budget()
        if size > budget:
            raise StreamError(f"a stream of {size} bytes is over the {budget}-byte limit")
        held = sum(stream.size for stream in self._open.values())
        while self._open and held + size > budget:
            held -= self._open.pop(next(iter(self._open))).size

    def __len__(self) -> int:
        return len(self._open)
