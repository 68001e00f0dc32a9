"""Large frames to another host go ahead of their frame set in chunks hashed as they go
(wire.stream): they arrive verified and writable, a chunk forged, reordered, lost or
passed off as another cluster's fails the frame set, and what an inbox holds for streams
not yet complete is bounded. End to end over real sockets: test_shared_memory's
"socket" round trips and test_multihost's large calls between namespaces."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from monarch_nb.wire import frames, stream

REMOTE = "tcp://10.0.0.1:5"  # not this host's: no shared memory


class Recorder:
    """Stands in for a zmq socket: the messages sent to it, each a list of frames."""

    def __init__(self):
        self.messages: list[list[bytes]] = []
        self._message: list[bytes] = []

    def send(self, data, flags=0, copy=True, track=False):
        self._message.append(bytes(data))
        if not flags & zmq.SNDMORE:
            self.messages.append(self._message)
            self._message = []


def routed(encoded: list, keys: list | None = None) -> list[list]:
    """Every message ``encoded`` makes on its way to another host: its chunks, then the
    frame set. ``keys``: gets the key each stream was hashed with (None: not hashed)."""
    sock, trackers = Recorder(), []

    def send_stream(cid, stream_id, kind, view, key):
        if keys is not None:
            keys.append(key)
        return stream.send(sock, trackers, cid, stream_id, kind, view, key)

    final = frames.route(REMOTE, encoded, send_stream)
    return [*sock.messages, list(final)]


def receive(messages: list[list], guard: frames.ReplayGuard) -> frames.Message:
    """What the inbox with ``guard`` makes of ``messages``: every chunk absorbed, then the frame set."""
    for message in messages[:-1]:
        with pytest.raises(frames.Absorbed):
            frames.decode(list(message), guard)
    return frames.decode(list(messages[-1]), guard)


@pytest.fixture
def value():
    frames.register_key("streams", b"s" * 32)
    return np.random.default_rng(7).integers(0, 256, 2 * stream.MIN_BYTES + 4097, np.uint8)  # a ragged last chunk


def test_a_large_frame_to_another_host_goes_ahead_in_chunks_and_arrives_verified_and_writable(value):
    encoded = frames.encode_value("streams", {"k": 1}, value, sign_at_send=True)  # as a call's arguments are
    keys: list = []
    before = frames.dropped()
    messages = routed(encoded, keys)
    chunks = -(-value.nbytes // stream.CHUNK_BYTES)
    assert len(messages) == chunks + 1 and all(len(m) == 2 for m in messages[:-1])
    assert b" stream " in messages[-1][0] and not messages[-1][-1]  # the frame set carries it emptied
    message = receive(messages, frames.ReplayGuard())
    got = message.value()
    assert message.header == {"k": 1} and np.array_equal(got, value)
    got[0] ^= 1  # the receiver's own memory
    assert frames.dropped() == before  # chunks are not drops

    again = routed(encoded, keys)  # the same frame set to a second host
    assert keys[0] is not None and keys[1] is None  # hashed once, for every send
    assert np.array_equal(receive(again, frames.ReplayGuard()).value(), value)


@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_streamed_bytes_and_bytearray_arrive_as_their_type(value, kind):
    data = kind(value.tobytes())
    got = receive(routed(frames.encode_value("streams", {}, data, sign_at_send=True)), frames.ReplayGuard()).value()
    assert type(got) is kind and got == data


def test_a_frame_set_signed_at_encode_streams_without_hashing_again(value):
    encoded = frames.encode_value("streams", {}, value)  # e.g. a port's message
    keys: list = []
    assert np.array_equal(receive(routed(encoded, keys), frames.ReplayGuard()).value(), value)
    assert keys == [None]


def test_a_forged_reordered_lost_or_foreign_chunk_fails_its_frame_set(value):
    frames.register_key("streams-other", b"o" * 32)
    encoded = frames.encode_value("streams", {}, value, sign_at_send=True)
    before = frames.dropped()

    forged = routed(encoded)
    forged[1][1] = bytes(len(forged[1][1]))
    with pytest.raises(frames.BadMessage, match="bad signature"):
        receive(forged, frames.ReplayGuard())

    swapped = routed(encoded)
    guard = frames.ReplayGuard()
    with pytest.raises(frames.Absorbed):
        frames.decode(swapped[0], guard)
    with pytest.raises(frames.BadMessage, match="does not add up"):  # a chunk out of order: the stream is dropped
        frames.decode(swapped[2], guard)
    with pytest.raises(frames.BadMessage, match="missing or incomplete"):
        frames.decode(swapped[-1], guard)

    lost = routed(encoded)
    with pytest.raises(frames.BadMessage, match="missing or incomplete"):
        receive([*lost[:-2], lost[-1]], frames.ReplayGuard())

    foreign = routed(encoded)  # chunks passed off as another cluster's, hashed with its key
    for message in foreign[:-1]:
        message[0] = message[0].replace(b"streams", b"streams-other")
    with pytest.raises(frames.BadMessage, match="streamed for another cluster"):
        receive(foreign, frames.ReplayGuard())

    unknown = routed(encoded)
    unknown[0][0] = unknown[0][0].replace(b"streams", b"nobody's")
    with pytest.raises(frames.BadMessage, match="does not add up"):
        frames.decode(unknown[0], frames.ReplayGuard())
    assert frames.dropped() == before + 6


def test_what_an_inbox_holds_for_incomplete_streams_is_bounded(monkeypatch):
    frames.register_key("streams-bound", b"b" * 32)
    keys = frames._keys[b"streams-bound"]
    budget = 3 * stream.MIN_BYTES
    streams = stream.Streams(lambda: budget)
    chunk = bytes(stream.CHUNK_BYTES)

    def start(stream_id: bytes, size: int) -> None:
        head = stream.MARKER + stream._HEAD.pack(stream_id, b"m", 0, size) + b"streams-bound"
        streams.absorb([head, chunk], {b"streams-bound": keys}.get)

    start(b"a" * 16, 2 * stream.MIN_BYTES)
    start(b"b" * 16, 2 * stream.MIN_BYTES)  # over the budget together: the oldest goes
    assert len(streams) == 1
    with pytest.raises(stream.StreamError, match="missing or incomplete"):
        streams.take(b"a" * 16, 2 * stream.MIN_BYTES)
    with pytest.raises(stream.StreamError, match="over the"):  # refused before anything is allocated
        start(b"c" * 16, 1 << 60)
    monkeypatch.setattr(stream, "STALE_S", -1.0)  # every stream in progress has gone quiet too long
    start(b"d" * 16, stream.MIN_BYTES)
    assert len(streams) == 1  # b was dropped, d is held
