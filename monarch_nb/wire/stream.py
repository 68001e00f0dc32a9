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
that check. The copy costs less than it saves: the value is written once, into pages
faulted in ahead in bulk, where one large message lands in a buffer zmq allocates and
faults in page by page (64 MiB: 0.83-0.90x; 256 MiB: 0.93x against 0.77x as one message;
1 GiB: median of 10, 0.79-0.83x against 0.75x; ``bench/bench_multihost.py``).

A chunk's contents are covered by the frame set's signature (a changed one changes the
digest; a reordered or missing one breaks its stream, which the frame set then lacks);
its head is signed on its own (HMAC-SHA256 with the cluster's key over the stream id,
kind, offset, size and a replay stamp: ``frames._chunk_head``), so that nobody without
the key can make an inbox hold anything: a chunk whose head fails is dropped before its
stream exists, and a replayed one is dropped like a replayed frame set.

A stream whose sender died half way is dropped once its inbox has spent ``STALE_S``
seconds reading other messages or waiting for any, without a chunk of it. Time the inbox's
thread spends elsewhere (running a long endpoint) does not count: a live sender's chunks
may be waiting in the queue behind it. Time spent waiting on an empty queue counts in
full (nothing of a live sender is held up then): a thread that reads an inbox with open
streams waits in steps of ``IDLE_CHECK_S`` (:func:`wait_idle`, from ``sockets.recv_frames``
and the mailbox's and asyncio daemons' waits), so that a half stream goes within
``STALE_S`` + ``IDLE_CHECK_S`` of idle time even if nothing else ever arrives.
"""

from __future__ import annotations

import mmap
import struct
import threading
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
IDLE_CHECK_S = 5.0  # steps of a wait on an inbox with open streams (see wait_idle)
_TICK_MAX_S = 1.0  # the most reading time one message counts for (see Streams.tick)

FIELDS = struct.Struct("<16scQQ")  # of a chunk's head: stream id, kind letter (wire.shm.kind_of), offset, size
_SNDMORE = int(zmq.SNDMORE)
_now = time.monotonic  # (tests replace it: never time.monotonic itself, which every thread reads)
# What this thread receives from: .socket, the socket it last read (sockets.recv_frames),
# and .streams, (Streams, the socket their last opened stream came from). A receiving
# loop's wait (sockets.recv_frames) knows its socket but not the inbox's Streams: it finds
# them here, and only for that socket (an actor's thread also reads its mailbox's replies).
reading = threading.local()


class StreamError(Exception):
    """A chunk or a frame set's reference to a stream that does not add up."""


def send(sock: zmq.Socket, trackers: list, head: Callable[[int], bytes], view: memoryview,
         key: bytes | None) -> bytes | None:
    """Send ``view`` (one frame of a frame set) on ``sock`` as chunk messages, each
    ``[head(offset), chunk]``, without copying it; appends to ``trackers`` what tells
    when the chunks have left. Returns the keyed BLAKE3 digest of ``view`` under ``key``,
    made chunk by chunk while zmq's I/O thread sends them, or ``None`` with no ``key``
    (the frame set was signed already)."""
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    hasher = blake3.blake3(key=key) if key is not None else None
    tracker = None
    for at in range(0, view.nbytes, CHUNK_BYTES):
        chunk = view[at:at + CHUNK_BYTES]
        sock.send(head(at), _SNDMORE)
        tracker = sock.send(chunk, copy=False, track=True)
        if hasher is not None:
            hasher.update(chunk)
    if tracker is not None:
        trackers.append(tracker)  # (one connection: the last chunk leaves last)
    return hasher.digest() if hasher is not None else None


class _Stream:
    """One frame arriving: its value so far, hashed as it was written."""

    __slots__ = ("keys", "kind", "size", "received", "faulted", "value", "view", "hasher", "touched")

    def __init__(self, keys: Any, kind: bytes, size: int, now: float):
        self.keys, self.kind, self.size, self.received, self.faulted = keys, kind, size, 0, 0
        self.value, self.view = _allocate(kind, size)
        self.hasher = blake3.blake3(key=keys.blake3)
        self.touched = now

    def put(self, chunk: memoryview, now: float) -> None:
        self.hasher.update(chunk)
        end = self.received + chunk.nbytes
        if self.view is None:
            self.value += chunk  # a bytearray growing in place (realloc): pages touched as written
        else:
            if end > self.faulted:
                ahead = max(end, min(self.size, self.faulted + PREFAULT_BYTES)) - self.faulted
                fill.prefault(self.view, self.faulted, ahead)
                self.faulted += ahead
            self.view[self.received:end] = chunk
        self.received = end
        self.touched = now

    def value_made(self) -> Any:
        if self.view is not None:
            self.view.release()
        if self.kind == b"b" and type(self.value) is not bytes:
            return bytes(self.value)  # (this interpreter's bytes layout is unknown: one copy)
        return self.value


def _allocate(kind: bytes, size: int) -> tuple[Any, memoryview | None]:
    """The object a frame of ``kind`` arrives as and a writable byte view to fill it
    through: a new ``bytes`` filled in place (``wire.fill``), or (anything else but a
    ``bytearray``) a private anonymous mapping, whose pages cost nothing until faulted in;
    a ``bytearray`` grows as the chunks come (no view), which ``bytearray(size)`` would
    zero all at once."""
    if kind == b"b":
        fresh = fill.fresh_bytes(size)
        if fresh is not None:
            return fresh
    if kind in (b"a", b"b"):
        return bytearray(), None
    # Private: Python's default for an anonymous mapping is shared, which the kernel backs
    # as shmem (1 GiB here: 430 ms to fault in and fill, 88 ms to unmap; private 345 and 24).
    mapped = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return mapped, memoryview(mapped)


def wait_idle(streams: "Streams", poll: Callable[[int], Any]) -> None:
    """Before a blocking receive on an inbox whose ``streams`` are open: wait for a
    message in steps of ``IDLE_CHECK_S`` with ``poll(timeout_ms)`` (true: something is
    there), counting each step that found nothing as idle time (:meth:`Streams.idle`);
    returns when something is there or no stream is left open."""
    while streams:
        start = _now()
        if poll(int(IDLE_CHECK_S * 1000)):
            return
        streams.idle(_now() - start)


class Streams:
    """The streams one inbox is receiving (used by that inbox's thread only)."""

    def __init__(self):
        self._open: dict[bytes, _Stream] = {}  # stream id -> stream
        self._clock = 0.0  # seconds spent reading while streams were open (tick)
        self._last = _now()

    def tick(self) -> None:
        """The inbox read a message: advance the reading clock (by the time since the
        last message, at most ``_TICK_MAX_S``: an inbox idle or busy elsewhere is not
        reading) and drop the streams that went ``STALE_S`` of it without a chunk."""
        now = _now()
        self._clock += min(now - self._last, _TICK_MAX_S)
        self._last = now
        self._drop_stale()

    def idle(self, waited: float) -> None:
        """The inbox waited ``waited`` seconds and found nothing to read: that time counts
        in full (no chunk of a live sender waits behind anything then); drop the streams
        that went ``STALE_S`` of reading time without a chunk."""
        self._clock += waited
        self._last = _now()
        self._drop_stale()

    def _drop_stale(self) -> None:
        for stream_id in [s for s, stream in self._open.items() if self._clock - stream.touched > STALE_S]:
            del self._open[stream_id]  # (its memory goes with it: nothing else refers to it)

    def absorb(self, stream_id: bytes, kind: bytes, offset: int, size: int, keys: Any, chunk) -> None:
        """Take one chunk (its head verified: ``keys`` are its cluster's): hash it and
        copy it to its place. Raises :class:`StreamError` for one out of order, of a
        stream that is too large or with no memory left for it (the stream is dropped)."""
        chunk = memoryview(chunk).cast("B")
        self.tick()
        stream = self._open.get(stream_id)
        try:
            if stream is None:
                if offset != 0 or size < MIN_BYTES:
                    raise StreamError(f"chunk at byte {offset} of a stream of {size} bytes that did not start")
                stream = self._open[stream_id] = _Stream(keys, kind, size, self._clock)
                reading.streams = (self, getattr(reading, "socket", None))
            if offset != stream.received or offset + chunk.nbytes > stream.size or size != stream.size \
                    or not chunk.nbytes or keys is not stream.keys:
                raise StreamError(f"chunk at byte {offset} of a stream that has {stream.received} of {stream.size}")
            stream.put(chunk, self._clock)
        except (StreamError, MemoryError, OSError) as e:  # (no memory for it: the inbox's thread goes on)
            self._open.pop(stream_id, None)
            raise e if isinstance(e, StreamError) else StreamError(f"no room for a stream of {size} bytes: {e!r}")

    def take(self, stream_id: bytes, size: int) -> tuple[Any, Any, bytes]:
        """The complete stream ``stream_id`` of ``size`` bytes, no longer held here:
        ``(value, keys it was hashed with, digest)``. Raises :class:`StreamError` when it
        is not here, not complete or of another size."""
        stream = self._open.pop(stream_id, None)
        if stream is None or stream.received != stream.size or stream.size != size:
            raise StreamError(f"stream {stream_id.hex()} is missing or incomplete")
        try:
            return stream.value_made(), stream.keys, stream.hasher.digest()
        except MemoryError as e:  # (the one copy of bytes where their layout is unknown)
            raise StreamError(f"no room for a stream of {size} bytes: {e!r}") from None

    def __len__(self) -> int:
        return len(self._open)
