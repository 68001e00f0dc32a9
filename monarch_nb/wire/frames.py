"""Signed frame sets: the wire format of every monarch_nb message.

A message is a list of zmq frames::

    [b"MNB1" + signature + cluster_id, header, body, *buffers]

``header`` is a small dict pickled with the standard library (routing: kind, port,
reply address); ``body`` is a cloudpickle stream whose out-of-band buffers follow as
their own frames. ``signature`` (32 bytes) is HMAC-SHA256 (RFC 2104) with the cluster's key
over every frame after it, each prefixed by its 8-byte length so frames can't be
re-split. A receiver verifies the signature before unpickling anything; frame sets
that fail are dropped and counted (:func:`dropped`), never unpickled.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

from ..errors import MessageTooLarge
from . import serialize

MAGIC = b"MNB1"
FIXED_FRAMES = 3  # magic + signature + cluster id, header, body; out-of-band buffers follow
_SIG = slice(len(MAGIC), len(MAGIC) + 32)
_LEN = struct.Struct("<Q")

_keys: dict[bytes, "hmac.HMAC"] = {}  # cluster id -> keyed HMAC to copy() per message
_dropped = 0
_dropped_lock = threading.Lock()


def max_message_bytes() -> int:
    """Largest message (all frames, bytes) sent or accepted: ``MONARCH_NB_MAX_MESSAGE_BYTES``,
    default 2 GiB."""
    return int(os.environ.get("MONARCH_NB_MAX_MESSAGE_BYTES", 2 << 30))


def register_key(cluster_id: str, key: bytes) -> None:
    """Trust ``key`` for messages of ``cluster_id`` (both signing and verifying)."""
    _keys[cluster_id.encode()] = hmac.new(key, digestmod=hashlib.sha256)


def dropped() -> int:
    """How many frame sets this process dropped for a missing or bad signature."""
    return _dropped


class BadMessage(Exception):
    """A frame set failed verification; it was not unpickled."""


@dataclass
class Message:
    header: dict
    body: Any = None  # bytes-like pickle stream, or None
    buffers: list = field(default_factory=list)

    def value(self) -> Any:
        """Unpickle the body (safe: the message was verified)."""
        return serialize.loads(self.body, self.buffers) if self.body is not None else None


def _mac(keyed: "hmac.HMAC", parts) -> bytes:
    mac = keyed.copy()
    for part in parts:
        view = memoryview(part)
        mac.update(_LEN.pack(view.nbytes))
        mac.update(view)
    return mac.digest()


def encode(cluster_id: str, header: dict, body: bytes | None = None, buffers=()) -> list:
    """Frames for ``header`` plus an already-pickled ``body`` and its buffers.

    Raises :class:`MessageTooLarge` when the frames exceed :func:`max_message_bytes`.
    """
    cid = cluster_id.encode()
    parts = [pickle.dumps(header, protocol=5), body if body is not None else b""]
    parts.extend(memoryview(b).cast("B") if not isinstance(b, bytes) else b for b in buffers)
    size = sum(memoryview(p).nbytes for p in parts)
    limit = max_message_bytes()
    if size > limit:
        raise MessageTooLarge(
            f"message of {size} bytes is over the {limit}-byte limit; send large data in "
            "smaller pieces, or raise MONARCH_NB_MAX_MESSAGE_BYTES in the client and every proc"
        )
    return [MAGIC + _mac(_keys[cid], parts) + cid, *parts]


def encode_value(cluster_id: str, header: dict, value: Any, what: str = "value") -> list:
    """Pickle ``value`` (out-of-band buffers included) and :func:`encode` it."""
    body, buffers = serialize.dumps(value, what)
    return encode(cluster_id, header, body, [b.raw() for b in buffers])


def decode(frames: list) -> Message:
    """Verify and parse frames; raises :class:`BadMessage` (and counts a drop) on any
    missing or bad signature. Only the header is unpickled here."""
    global _dropped
    try:
        prefix = bytes(frames[0])
        if len(frames) < FIXED_FRAMES or not prefix.startswith(MAGIC):
            raise BadMessage("not a monarch_nb frame set")
        key = _keys.get(prefix[_SIG.stop:])
        if key is None:
            raise BadMessage("unknown cluster id")
        parts = frames[1:]
        if not hmac.compare_digest(_mac(key, parts), prefix[_SIG]):
            raise BadMessage("bad signature")
    except BadMessage:
        with _dropped_lock:
            _dropped += 1
        raise
    header = pickle.loads(parts[0])
    body = parts[1] if memoryview(parts[1]).nbytes else None
    return Message(header, body, [memoryview(b) for b in parts[2:]])
