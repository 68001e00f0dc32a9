"""Signed frame sets: the wire format of every monarch_nb message.

A message is a list of zmq frames::

    [b"MNB1" + signature + stamp + cluster_id, header, body, *buffers]

``header`` is a small dict pickled with the standard library (routing: kind, port,
reply address); ``body`` is a cloudpickle stream whose out-of-band buffers follow as
their own frames. ``signature`` (32 bytes) is HMAC-SHA256 (RFC 2104) with the cluster's key
over the stamp and every frame after it, each prefixed by its 8-byte length so frames
can't be re-split. A frame of ``BLAKE3_MIN_BYTES`` or more enters the HMAC as its keyed
BLAKE3 digest instead of its bytes: keyed BLAKE3 is itself a MAC, under a key derived
from the cluster's, and it runs at memory speed on several threads where HMAC-SHA256
runs at ~1.5 GB/s on one; each side hashes a large buffer once. A call's arguments and
a return value are signed as they leave (:func:`route`), when the route is known: a
buffer that goes through a shared-memory segment enters as the segment's name instead,
and is never hashed (``wire.shm`` says why that holds); one that goes to another host
is sent ahead of the frame set in chunks, hashed as they go (``wire.stream``). A
receiver verifies the signature before unpickling anything; frame sets that fail are
dropped and counted (:func:`dropped`), never unpickled.

A small frame set (no out-of-band buffers, nothing routed) travels as one zmq frame,
``b"MNP1" + len(prefix) + len(header) + prefix + header + body`` (lengths as 4-byte
little-endian): one send and one receive instead of three, which is most of what a
socket costs per message (:func:`pack`, undone by :func:`decode`). The signature is the
same as over the three frames.

The ``stamp`` (24 bytes) stops replays: the sender's id (8 random bytes per process
and thread), a sequence number counting that sender's messages, and its wall-clock
time. Each inbox keeps a :class:`ReplayGuard`: a stamp seen before, one too far
behind its sender's newest, or one from an unknown sender sent before the guard
existed (minus ``CLOCK_SKEW_S``), is dropped and counted like a bad signature. As in
jupyter_client's ``Session.digest_history``, the check runs after the signature's
(only signed stamps count) and before anything is unpickled. A frame set encoded once
may go to many inboxes (a call to every actor of a mesh); each accepts it once.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import itertools
import os
import pickle
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection

import blake3

from ..errors import MessageTooLarge
from . import serialize, shm, stream, zap

MAGIC = b"MNB1"
FIXED_FRAMES = 3  # magic + signature + stamp + cluster id, header, body; out-of-band buffers follow
_SIG = slice(len(MAGIC), len(MAGIC) + 32)
_STAMP = struct.Struct("<8sQd")  # sender id, sequence number, sent at (Unix time, s)
_STAMP_AT = slice(_SIG.stop, _SIG.stop + _STAMP.size)
_LEN = struct.Struct("<Q")
PACKED = b"MNP1"  # one frame holding a small frame set's three (see the module docstring)
_PACKED_LENS = struct.Struct("<II")

# How far a sender's messages may arrive out of order at one inbox (several sockets of
# one thread, asyncio sends) before the older ones count as replays; and how far the
# clocks of two hosts may disagree (seconds).
REPLAY_WINDOW = 1024
CLOCK_SKEW_S = 30.0

# Frames this large are MACed with keyed BLAKE3 (see the module docstring): below it,
# one HMAC pass costs less than starting BLAKE3's threads.
BLAKE3_MIN_BYTES = 1 << 20
# Frames this large are hashed on BLAKE3's own threads too; below it, on the calling
# thread only, which is faster where the other cores are busy moving bytes (two network
# namespaces of the 2-core VM here, RDMABuffer's 2 MiB chunks: 0.86x a raw zmq stream
# against 0.82x with threads).
BLAKE3_THREADS_MIN_BYTES = 16 << 20


@dataclass(frozen=True)
class _Keys:
    hmac: Any  # a keyed HMAC-SHA256 object, to copy() per message
    blake3: bytes  # 32 bytes, derived from the cluster's key


_keys: dict[bytes, _Keys] = {}  # cluster id -> its keys
_dropped = 0
_dropped_lock = threading.Lock()


# The largest frame an inbox takes in (bytes; libzmq's MAXMSGSIZE, checked against a
# frame's announced length before anything is allocated for it): libzmq holds a frame
# whole before anyone can check its signature, so this is what a peer without the
# cluster's key can make a process hold per frame. Larger frames of the cluster's own
# never travel as one: they go through shared memory or ahead in signed chunks (route).
MAX_FRAME_BYTES = stream.MIN_BYTES


def max_message_bytes() -> int:
    """Largest message (all frames, bytes) this process sends: ``MONARCH_NB_MAX_MESSAGE_BYTES``,
    default 2 GiB. Raises ``ValueError`` naming the variable and its value when that is
    not a whole number of bytes above 0."""
    raw = os.environ.get("MONARCH_NB_MAX_MESSAGE_BYTES")
    if raw is None:
        return 2 << 30
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if limit <= 0:
        raise ValueError(f"MONARCH_NB_MAX_MESSAGE_BYTES={raw!r} is not a message size: give a whole number of bytes "
                         "above 0 (e.g. 4294967296 for 4 GiB), or unset it for the default, 2 GiB")
    return limit


def register_key(cluster_id: str, key: bytes) -> None:
    """Trust ``key`` for messages of ``cluster_id`` (both signing and verifying)."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    # hmac.HMAC wraps OpenSSL's HMAC object in Python methods (copy, update, digest: a
    # dozen calls for each small message); use that object itself where there is one.
    _keys[cluster_id.encode()] = _Keys(getattr(mac, "_hmac", None) or mac,
                                       hmac.digest(key, b"monarch_nb large frames, keyed BLAKE3", "sha256"))
    zap.trust(cluster_id, key)  # its peers may connect to this process's inboxes


def trusted_clusters() -> list[str]:
    """The clusters whose keys this process holds, in the order registered."""
    return [c.decode() for c in _keys]


def dropped() -> int:
    """How many frame sets this process dropped for a missing or bad signature."""
    return _dropped


class BadMessage(Exception):
    """A frame set failed verification; it was not unpickled."""


class Absorbed(BadMessage):
    """What arrived was a chunk of a large frame sent ahead of its frame set
    (``wire.stream``): kept by the inbox, nothing to act on yet. (A :class:`BadMessage`, so
    that every receiving loop goes on to the next message; not counted as dropped.)"""


class ReplayGuard:
    """The stamps one inbox has accepted (see the module docstring), and the large frames
    it is receiving ahead of their frame sets (``streams``, ``wire.stream``). Used by one
    thread at a time (the inbox's)."""

    def __init__(self):
        self.started = time.time()
        self.streams = stream.Streams()
        self._senders: dict[bytes, list[int]] = {}  # sender -> [newest seq, bitmap of the window below it]

    def accept(self, sender: bytes, seq: int, sent_at: float) -> bool:
        """Record the stamp; False when it is a replay (or too stale to tell)."""
        state = self._senders.get(sender)
        if state is None:
            if sent_at < self.started - CLOCK_SKEW_S:
                return False
            self._senders[sender] = [seq, 1]
            return True
        newest, seen = state
        if seq == newest + 1:  # the usual case: in order
            state[0], state[1] = seq, ((seen << 1) | 1) & _WINDOW_MASK
            return True
        if seq > newest:
            state[0], state[1] = seq, ((seen << (seq - newest)) | 1) & _WINDOW_MASK
            return True
        behind = newest - seq
        if behind >= REPLAY_WINDOW or (seen >> behind) & 1:
            return False
        state[1] = seen | (1 << behind)
        return True


_WINDOW_MASK = (1 << REPLAY_WINDOW) - 1


_senders = threading.local()  # .id, .seq: this thread's sender id and sequence numbers
# The same for the chunks of streamed frames (wire.stream), a sender of their own: a
# frame set is stamped when encoded, before its chunks, and must not fall more than
# REPLAY_WINDOW behind them.
_chunk_senders = threading.local()
_pack_stamp, _now = _STAMP.pack, time.time


def _stamp(senders: threading.local | None = None) -> bytes:
    senders = senders or _senders
    try:
        sender_id, seq = senders.id, next(senders.seq)
    except AttributeError:
        sender_id = senders.id = os.urandom(8)
        senders.seq = itertools.count(1)
        seq = next(senders.seq)
    return _pack_stamp(sender_id, seq, _now())


def _new_senders_after_fork() -> None:
    global _senders, _chunk_senders
    _senders, _chunk_senders = threading.local(), threading.local()  # a forked child must not reuse its parent's ids


os.register_at_fork(after_in_child=_new_senders_after_fork)


@dataclass
class Message:
    header: dict
    body: Any = None  # bytes-like pickle stream, or None
    buffers: list = field(default_factory=list)  # bytes-like: memoryviews, or bytes/bytearray made on arrival
    sent_at: float = 0.0  # when its sender stamped it (Unix time, s, the sender's clock); 0.0 if not known

    _given: bool = False  # value() has handed out the bytearray buffers once

    def value(self) -> Any:
        """Unpickle the body (safe: the message was verified). A ``bytearray`` the
        transport made is the first value's own; later calls get copies of it."""
        if self.body is None:
            return None
        buffers = self.buffers
        if self._given:
            buffers = [bytearray(b) if type(b) is bytearray else b for b in buffers]
        self._given = True
        return serialize.loads(self.body, buffers)


def _blake3(view: memoryview, keys: _Keys) -> bytes:
    threads = blake3.blake3.AUTO if view.nbytes >= BLAKE3_THREADS_MIN_BYTES else 1
    return blake3.blake3(view, key=keys.blake3, max_threads=threads).digest()


def _mac(keys: _Keys, stamp: bytes, parts) -> bytes:
    mac = keys.hmac.copy()
    mac.update(stamp)
    for part in parts:
        view = memoryview(part)
        mac.update(_LEN.pack(view.nbytes))
        if view.nbytes >= BLAKE3_MIN_BYTES:  # the length says which: no frame is read both ways
            mac.update(_blake3(view, keys))
        else:
            mac.update(view)
    return mac.digest()


def _mac_small(keys: _Keys, stamp: bytes, header: bytes, body: bytes) -> bytes:
    """:func:`_mac` of a frame set of a header and a body only, both small: one update."""
    mac = keys.hmac.copy()
    mac.update(b"".join((stamp, _LEN.pack(len(header)), header, _LEN.pack(len(body)), body)))
    return mac.digest()


def _mac_routed(keys: _Keys, stamp: bytes, parts, segments: dict, digests: dict | None = None) -> bytes:
    """:func:`_mac` of a frame set signed as it left (:func:`route`): a frame moved to a
    shared-memory segment enters as that segment's name, not its contents (``wire.shm``
    says why that holds); other large frames as their keyed BLAKE3. ``segments``: part
    index -> segment name; ``digests``: part index -> digest, those of earlier sends of
    the same frame set, filled in here. (:func:`_mac` is this without segments, kept
    apart because every small message runs it.)"""
    mac = keys.hmac.copy()
    mac.update(stamp)
    for i, part in enumerate(parts):
        view = memoryview(part)
        mac.update(_LEN.pack(view.nbytes))
        name = segments.get(i)
        if name is not None:
            mac.update(b"segment " + name.encode())
        elif view.nbytes >= BLAKE3_MIN_BYTES:
            digest = digests.get(i) if digests is not None else None
            if digest is None:
                digest = _blake3(view, keys)
                if digests is not None:
                    digests[i] = digest
            mac.update(digest)
        else:
            mac.update(view)
    return mac.digest()


class _Unsigned:
    """First frame of a frame set :func:`encode` left to be signed by its sends."""

    __slots__ = ("keys", "stamp", "cid", "digests")

    def __init__(self, keys: _Keys, stamp: bytes, cid: bytes):
        self.keys, self.stamp, self.cid = keys, stamp, cid
        self.digests: dict[int, bytes] = {}  # keyed BLAKE3 of large frames, made by a first send over a socket


def encode(cluster_id: str, header: dict, body: bytes | None = None, buffers=(), sign_at_send: bool = False) -> list:
    """Frames for ``header`` plus an already-pickled ``body`` and its buffers.

    ``sign_at_send``: frames only for ``sockets.Outbox.send``, which signs them for each
    destination (:func:`route`) when they hold a large frame, so one moved to shared
    memory is signed by its segment's name and never hashed (``wire.shm``).

    Raises :class:`MessageTooLarge` when the frames exceed :func:`max_message_bytes`.
    """
    cid = cluster_id.encode()
    if not buffers and (body is None or type(body) is bytes):  # most messages: the same frames, written out
        header_bytes = pickle.dumps(header, protocol=5)
        body = body or b""
        size = len(header_bytes) + len(body)
        if size >= shm.MIN_BYTES or size > max_message_bytes():
            return _encode_parts(cid, [header_bytes, body], size, sign_at_send)
        stamp = _stamp()
        return [MAGIC + _mac_small(_keys[cid], stamp, header_bytes, body) + stamp + cid, header_bytes, body]
    if body is not None and not isinstance(body, bytes):
        # A body received without a copy (a zmq.Frame, as a router passes one on): a view
        # of it, since pyzmq can't track the sending of a Frame it did not make with tracking.
        body = memoryview(body).cast("B")
    parts = [pickle.dumps(header, protocol=5), body if body is not None else b""]
    parts.extend(memoryview(b).cast("B") if not isinstance(b, bytes) else b for b in buffers)
    return _encode_parts(cid, parts, sum(memoryview(p).nbytes for p in parts), sign_at_send)


def _encode_parts(cid: bytes, parts: list, size: int, sign_at_send: bool) -> list:
    """:func:`encode`'s frames for ``parts`` (the pickled header, the body, the
    buffers) of ``size`` bytes in all, of cluster ``cid``."""
    limit = max_message_bytes()
    if size > limit:
        raise MessageTooLarge(
            f"message of {size} bytes is over the {limit}-byte limit; send large data in "
            "smaller pieces, or raise MONARCH_NB_MAX_MESSAGE_BYTES in the client and every proc"
        )
    stamp = _stamp()
    if sign_at_send and size >= shm.MIN_BYTES and any(memoryview(b).nbytes >= shm.MIN_BYTES for b in parts):
        return [_Unsigned(_keys[cid], stamp, cid), *parts]  # a buffer that may go through shared memory
    return [MAGIC + _mac(_keys[cid], stamp, parts) + stamp + cid, *parts]


def encode_value(cluster_id: str, header: dict, value: Any, what: str = "value", sign_at_send: bool = False,
                 destinations: Collection[str] | None = None) -> list:
    """Pickle ``value`` (out-of-band buffers included) and :func:`encode` it.
    ``destinations``: the addresses it will be sent to, when known (``serialize.dumps``)."""
    body, buffers = serialize.dumps(value, what, destinations)
    return encode(cluster_id, header, body, [b.raw() for b in buffers], sign_at_send)


def signed_at_send(frames: list) -> bool:
    """Whether :func:`encode` left ``frames`` to be signed by their sends (they hold a
    buffer large enough for shared memory)."""
    return type(frames[0]) is _Unsigned


def cluster_of(frames: list) -> bytes | None:
    """The cluster id of a frame set :func:`encode` made (signed or to be signed at
    send), ``None`` for anything else (a socket's credentials name it: ``wire.zap``)."""
    first = frames[0]
    if type(first) is bytes:  # (encode's, signed: the usual case)
        return first[_STAMP_AT.stop:] if first.startswith(MAGIC) and len(first) > _STAMP_AT.stop else None
    if type(first) is _Unsigned:
        return first.cid
    try:
        prefix = bytes(first)
    except TypeError:
        return None
    return prefix[_STAMP_AT.stop:] if prefix.startswith(MAGIC) and len(prefix) > _STAMP_AT.stop else None


def needs_route(frames: list) -> bool:
    """Whether ``frames`` must go through :func:`route` before a socket: they hold
    out-of-band buffers, or a header or body too large to travel as one frame."""
    if len(frames) != FIXED_FRAMES:
        return len(frames) > FIXED_FRAMES
    _, header, body = frames
    return ((len(header) if type(header) is bytes else memoryview(header).nbytes) >= shm.MIN_BYTES
            or (len(body) if type(body) is bytes else memoryview(body).nbytes) >= shm.MIN_BYTES)


def route(address: str, frames: list, send_stream: Callable[[Callable[[int], bytes], memoryview, bytes | None],
                                                            bytes | None]) -> list:
    """``frames`` as they leave for ``address``: large frames (the header and body too)
    moved to shared memory or sent ahead in chunks (``wire.shm.offload``), so that none
    left on the socket is over ``MAX_FRAME_BYTES``, and a frame set :func:`encode` left
    unsigned signed for that route. ``frames`` itself is left as it was (a call sends
    it to every actor of a mesh).

    ``send_stream(head, view, key)`` sends one frame ahead (``wire.stream.send`` on the
    destination's socket; ``head(offset)``: a chunk's signed head) and returns its keyed
    BLAKE3 digest under ``key`` (``None``: no digest wanted)."""
    first = frames[0]
    unsigned = type(first) is _Unsigned
    cid = first.cid if unsigned else bytes(first)[_STAMP_AT.stop:]
    segments: dict[int, str] = {}
    streams: list = []
    out = shm.offload(address, cid.decode(), frames, 1, segments if unsigned else None, streams)
    keys = first.keys if unsigned else _keys[cid]
    for index, stream_id, kind, view in streams:
        # A digest is wanted for signing: not for a frame set signed at encode, nor again
        # for a frame an earlier send of this frame set hashed.
        wanted = unsigned and index - 1 not in first.digests
        head = functools.partial(_chunk_head, keys, cid, stream_id, kind.encode(), view.nbytes)
        digest = send_stream(head, view, keys.blake3 if wanted else None)
        if wanted:
            first.digests[index - 1] = digest
    if not unsigned:
        return out
    at = 1 if out is not frames else 0  # after the descriptor, if there is one
    out = list(out) if out is frames else out
    signature = _mac_routed(first.keys, first.stamp, frames[1:], {i - 1: n for i, n in segments.items()},
                            first.digests)
    out[at] = MAGIC + signature + first.stamp + first.cid
    return out


def _chunk_head(keys: _Keys, cid: bytes, stream_id: bytes, kind: bytes, size: int, offset: int) -> bytes:
    """The head of the chunk at ``offset`` of a streamed frame (``wire.stream``): its
    fields and a replay stamp, signed with the cluster's key."""
    fields = stream.FIELDS.pack(stream_id, kind, offset, size) + _stamp(_chunk_senders)
    mac = keys.hmac.copy()
    mac.update(fields)
    return stream.MARKER + mac.digest() + fields + cid


_CHUNK_FIELDS = slice(len(stream.MARKER) + 32, len(stream.MARKER) + 32 + stream.FIELDS.size + _STAMP.size)


def _absorb(frames: list, guard: ReplayGuard) -> None:
    """Keep a chunk of a streamed frame in ``guard``'s streams if its head is signed
    and fresh; raises :class:`Absorbed` then, else :class:`BadMessage` (counted)."""
    global _dropped
    try:
        head = bytes(frames[0])
        if not head.startswith(stream.MARKER) or len(head) < _CHUNK_FIELDS.stop:
            raise BadMessage("not a monarch_nb frame set")
        keys = _keys.get(head[_CHUNK_FIELDS.stop:])
        if keys is None:
            raise BadMessage("unknown cluster id")
        fields = head[_CHUNK_FIELDS]
        mac = keys.hmac.copy()
        mac.update(fields)
        if not hmac.compare_digest(mac.digest(), head[len(stream.MARKER):_CHUNK_FIELDS.start]):
            raise BadMessage("bad signature")
        if not guard.accept(*_STAMP.unpack_from(fields, stream.FIELDS.size)):
            raise BadMessage("replayed")
        try:
            guard.streams.absorb(*stream.FIELDS.unpack_from(fields), keys, frames[1])
        except stream.StreamError as e:
            raise BadMessage(str(e)) from None
    except BadMessage:
        with _dropped_lock:
            _dropped += 1
        raise
    raise Absorbed()


def pack(frames: list) -> bytes:
    """A small signed frame set (:func:`encode`'s, exactly ``FIXED_FRAMES`` frames, none
    left to sign or route: see :func:`needs_route`) as the one frame it travels in."""
    prefix, header, body = frames
    return b"".join((PACKED, _PACKED_LENS.pack(len(prefix), len(header)), prefix, header, body))


def _fresh_header(stamp: bytes, header_bytes, guard: ReplayGuard | None) -> tuple[dict, float]:
    """The header of a frame set whose signature checked, and when it was sent: raises
    :class:`BadMessage` when ``guard`` saw its stamp (a replay) or the header is not a
    readable dict. The last checks of :func:`decode`, on either path."""
    sender, seq, sent_at = _STAMP.unpack(stamp)
    if guard is not None and not guard.accept(sender, seq, sent_at):
        raise BadMessage("replayed")
    try:
        header = pickle.loads(header_bytes)
    except Exception as e:  # signed, so not hostile, but not ours to act on
        raise BadMessage(f"unreadable header: {e!r}") from None
    if not isinstance(header, dict):
        raise BadMessage("header is not a dict")
    return header, sent_at


_PACKED_AT = len(PACKED) + _PACKED_LENS.size  # where a packed frame's prefix starts
# No packed frame is larger (its header and body are each under shared memory's
# threshold: needs_route); a larger lone frame is refused before it is copied.
_PACKED_MAX = 2 * shm.MIN_BYTES + 4096


def _decode_packed(frame: bytes, guard: ReplayGuard | None) -> Message:
    """:func:`decode` of a frame set :func:`pack` joined into one frame: the same checks
    in the same order, written out for the one shape most messages have (a call, a
    reply): a small frame, so copied rather than viewed, and signed over its three
    frames as :func:`_mac` signs them, in one update."""
    global _dropped
    try:
        if frame[:len(PACKED)] != PACKED or len(frame) < _PACKED_AT:
            raise BadMessage("not a monarch_nb frame set")
        prefix_len, header_len = _PACKED_LENS.unpack_from(frame, len(PACKED))
        header_at = _PACKED_AT + prefix_len
        body_at = header_at + header_len
        if body_at > len(frame) or prefix_len < _STAMP_AT.stop or frame[_PACKED_AT:_PACKED_AT + len(MAGIC)] != MAGIC:
            raise BadMessage("not a monarch_nb frame set")
        prefix = frame[_PACKED_AT:header_at]
        key = _keys.get(prefix[_STAMP_AT.stop:])
        if key is None:
            raise BadMessage("unknown cluster id")
        stamp = prefix[_STAMP_AT]
        header_bytes, body = frame[header_at:body_at], frame[body_at:]
        if not hmac.compare_digest(_mac_small(key, stamp, header_bytes, body), prefix[_SIG]):
            raise BadMessage("bad signature")
        header, sent_at = _fresh_header(stamp, header_bytes, guard)
    except BadMessage:
        with _dropped_lock:
            _dropped += 1
        raise
    return Message(header, body or None, [], sent_at)


def decode(frames: list, guard: ReplayGuard | None) -> Message:
    """Verify and parse frames (large ones mapped from shared memory or taken from the
    streams that carried them first: ``wire.shm``, ``wire.stream``); raises
    :class:`BadMessage` (and counts a drop) on a missing or bad signature, a replay
    (``guard``: the receiving inbox's; ``None`` only where one frame set may legitimately
    arrive twice, and no streamed frame can) or a header that is not a dict, and
    :class:`Absorbed` for a chunk of a stream (kept in ``guard``). Only the header is
    unpickled here (with the standard library's pickle)."""
    global _dropped
    if guard is not None:
        if len(frames) == 2:  # a chunk (a frame set has FIXED_FRAMES or more)
            _absorb(frames, guard)
        if guard.streams:
            guard.streams.tick()
    if len(frames) == 1:
        frame = frames[0]
        return _decode_packed(bytes(frame) if len(frame) <= _PACKED_MAX else b"", guard)
    try:
        prefix = bytes(frames[0])
        segments: dict[int, str] = {}  # index -> name of a segment signed by name
        digests: dict[int, tuple] = {}  # index -> (keys, digest) of a streamed frame
        if prefix.startswith(shm.MARKER):
            try:
                frames = shm.restore(frames, trusted_clusters(), segments,
                                     guard.streams if guard is not None else None, digests)
            except shm.SegmentError as e:
                raise BadMessage(str(e)) from None
            prefix = bytes(frames[0])
        if len(frames) < FIXED_FRAMES or not prefix.startswith(MAGIC) or len(prefix) < _STAMP_AT.stop:
            raise BadMessage("not a monarch_nb frame set")
        key = _keys.get(prefix[_STAMP_AT.stop:])
        if key is None:
            raise BadMessage("unknown cluster id")
        stamp = prefix[_STAMP_AT]
        parts = frames[1:]
        if any(keys is not key for keys, _ in digests.values()):
            raise BadMessage("a frame streamed for another cluster")
        signature = _mac_routed(key, stamp, parts, {i - 1: n for i, n in segments.items()},
                                {i - 1: digest for i, (_, digest) in digests.items()}) if segments or digests \
            else _mac(key, stamp, parts)
        if not hmac.compare_digest(signature, prefix[_SIG]):
            raise BadMessage("bad signature")
        header, sent_at = _fresh_header(stamp, parts[0], guard)
    except BadMessage:
        with _dropped_lock:
            _dropped += 1
        raise
    body = parts[1] if memoryview(parts[1]).nbytes else None
    # A bytes or bytearray buffer (wire.shm read it into one) is the value itself.
    return Message(header, body, [b if type(b) in _OWNING else memoryview(b) for b in parts[2:]], sent_at)


_OWNING = (bytes, bytearray)


def count_dropped() -> None:
    """Count a verified message that no handler could act on (a header missing a key)."""
    global _dropped
    with _dropped_lock:
        _dropped += 1
