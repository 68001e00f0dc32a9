"""Large frames to another host go ahead of their frame set in chunks hashed as they go
(wire.stream): they arrive verified and writable; a chunk forged, unsigned, replayed,
reordered or lost, or one cluster's stream named by another's frame set, never gets
unpickled; streams that arrive together are all kept, and a dead sender's half stream is
dropped after STALE_S of its inbox reading or waiting for messages. End to end over real sockets: test_shared_memory's
"socket" round trips and test_multihost's large calls between namespaces."""

from __future__ import annotations

import collections
import re
import threading
import time

import numpy as np
import pytest
import zmq

from monarch_nb.wire import frames, sockets, stream, zap
from conftest import wait_until

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

    def send_stream(head, view, key):
        if keys is not None:
            keys.append(key)
        return stream.send(sock, trackers, head, view, key)

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


def test_a_forged_unsigned_replayed_reordered_or_lost_chunk_never_gets_unpickled(value):
    encoded = frames.encode_value("streams", {}, value, sign_at_send=True)
    before = frames.dropped()

    forged = routed(encoded)  # a chunk's contents changed on the way: the digest differs
    forged[1][1] = bytes(len(forged[1][1]))
    with pytest.raises(frames.BadMessage, match="bad signature"):
        receive(forged, frames.ReplayGuard())

    guard = frames.ReplayGuard()
    unsigned = routed(encoded)  # a head changed: nothing is kept of it
    head = bytearray(unsigned[0][0])
    head[-len(b"streams") - 1] ^= 1  # (the size field's last byte)
    with pytest.raises(frames.BadMessage, match="bad signature"):
        frames.decode([bytes(head), unsigned[0][1]], guard)
    with pytest.raises(frames.BadMessage, match="unknown cluster"):
        frames.decode([unsigned[0][0].replace(b"streams", b"nobody's"), unsigned[0][1]], guard)
    assert len(guard.streams) == 0
    with pytest.raises(frames.Absorbed):
        frames.decode(unsigned[0], guard)
    with pytest.raises(frames.BadMessage, match="replayed"):
        frames.decode(unsigned[0], guard)

    swapped = routed(encoded)
    guard = frames.ReplayGuard()
    with pytest.raises(frames.Absorbed):
        frames.decode(swapped[0], guard)
    with pytest.raises(frames.BadMessage, match="of a stream that has"):  # out of order: the stream is dropped
        frames.decode(swapped[2], guard)
    with pytest.raises(frames.BadMessage, match="missing or incomplete"):
        frames.decode(swapped[-1], guard)

    lost = routed(encoded)
    with pytest.raises(frames.BadMessage, match="missing or incomplete"):
        receive([*lost[:-2], lost[-1]], frames.ReplayGuard())
    assert frames.dropped() == before + 7


def test_a_frame_set_naming_another_clusters_stream_is_dropped(value):
    frames.register_key("streams-other", b"o" * 32)
    ours = routed(frames.encode_value("streams", {}, value, sign_at_send=True))
    theirs = routed(frames.encode_value("streams-other", {}, value, sign_at_send=True))
    our_id, their_id = (bytes(m[-1][0]).rpartition(b" ")[2] for m in (ours, theirs))
    guard = frames.ReplayGuard()
    for chunk in ours[:-1]:
        with pytest.raises(frames.Absorbed):
            frames.decode(chunk, guard)
    with pytest.raises(frames.BadMessage, match="streamed for another cluster"):
        frames.decode([theirs[-1][0].replace(their_id, our_id), *theirs[-1][1:]], guard)


def _chunk(guard: frames.ReplayGuard, stream_id: bytes, size: int) -> None:
    """A first chunk of a stream of ``size`` bytes, signed for cluster "streams", into ``guard``."""
    head = frames._chunk_head(frames._keys[b"streams"], b"streams", stream_id, b"m", size, 0)
    with pytest.raises(frames.Absorbed):
        frames.decode([head, bytes(stream.CHUNK_BYTES)], guard)


def test_streams_arriving_together_are_all_kept_whatever_their_total(value, monkeypatch):
    monkeypatch.setenv("MONARCH_NB_MAX_MESSAGE_BYTES", str(2 * stream.MIN_BYTES))
    guard = frames.ReplayGuard()
    for n in range(4):  # 4x this process's own limit in all
        _chunk(guard, bytes([n]) * 16, 2 * stream.MIN_BYTES)
    assert len(guard.streams) == 4


def test_a_message_over_the_receivers_own_limit_arrives_since_its_senders_limit_governs(value, monkeypatch):
    # A client started with a larger MONARCH_NB_MAX_MESSAGE_BYTES than a proc on another
    # host: its call's stream was dropped at the proc unseen and the call waited for ever
    # (through shared memory, on one host, the same message always arrived).
    messages = routed(frames.encode_value("streams", {"k": 2}, value, sign_at_send=True))
    monkeypatch.setenv("MONARCH_NB_MAX_MESSAGE_BYTES", str(stream.MIN_BYTES))  # the receiver's, under value's size
    before = frames.dropped()
    assert np.array_equal(receive(messages, frames.ReplayGuard()).value(), value)
    assert frames.dropped() == before
    with pytest.raises(frames.MessageTooLarge, match="over the"):  # its own sends are held to it
        frames.encode_value("streams", {}, value, sign_at_send=True)


@pytest.mark.parametrize("raw", ["abc", "-1", "0", "1.5"])
def test_a_bad_max_message_bytes_is_refused_naming_the_variable_and_what_it_takes(raw, monkeypatch):
    # "abc" was a raw int() traceback at the first message; "-1" refused every message.
    monkeypatch.setenv("MONARCH_NB_MAX_MESSAGE_BYTES", raw)
    with pytest.raises(ValueError, match=rf"^MONARCH_NB_MAX_MESSAGE_BYTES='{re.escape(raw)}' is not a message size: "
                                         "give a whole number of bytes above 0"):
        frames.max_message_bytes()


def test_a_bad_max_message_bytes_stops_a_cluster_from_starting(tmp_path, monkeypatch):
    from monarch_nb.client.cluster import Cluster

    monkeypatch.setenv("MONARCH_NB_HOME", str(tmp_path))
    monkeypatch.setenv("MONARCH_NB_MAX_MESSAGE_BYTES", "4GB")
    with pytest.raises(ValueError, match="MONARCH_NB_MAX_MESSAGE_BYTES='4GB'"):
        Cluster.start_ephemeral()
    assert not any((tmp_path / "clusters").glob("*")), "no cluster directory is left behind"
    monkeypatch.setenv("MONARCH_NB_MAX_MESSAGE_BYTES", "4_294_967_296")
    assert frames.max_message_bytes() == 4 << 30


def test_a_half_stream_is_dropped_after_stale_s_of_reading_not_of_idling(value, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(stream, "_now", lambda: now[0])
    guard = frames.ReplayGuard()
    _chunk(guard, b"h" * 16, stream.MIN_BYTES)  # its sender died after this
    now[0] += 10 * stream.STALE_S  # a gap between two messages: its actor in a long endpoint
    guard.streams.tick()
    assert len(guard.streams) == 1
    for _ in range(int(stream.STALE_S) + 2):  # then reading other messages, one a second
        now[0] += 1.0
        guard.streams.tick()
    assert len(guard.streams) == 0


def test_a_half_stream_is_dropped_after_stale_s_of_its_inbox_waiting_for_nothing(value, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(stream, "_now", lambda: now[0])
    guard = frames.ReplayGuard()
    _chunk(guard, b"i" * 16, stream.MIN_BYTES)  # its sender died after this
    waits: list[int] = []

    def nothing_comes(timeout_ms: int) -> bool:
        waits.append(timeout_ms)
        now[0] += timeout_ms / 1000
        return False

    stream.wait_idle(guard.streams, nothing_comes)  # returns once no stream is left to wait for
    assert len(guard.streams) == 0
    waited = sum(waits) / 1000
    assert stream.STALE_S < waited <= stream.STALE_S + stream.IDLE_CHECK_S


def test_a_half_stream_in_a_blocking_inbox_is_dropped_while_it_waits(value, monkeypatch):
    """An actor's loop blocked in recv_frames with nothing ever arriving (90 s idle kept a
    1 GiB argument's first 600 MiB before): its wait counts, and ends with the next message."""
    now = [1000.0]
    monkeypatch.setattr(stream, "_now", lambda: now[0])
    monkeypatch.setattr(stream, "IDLE_CHECK_S", 0.01)
    inbox, address = sockets.bind_inbox()
    out = zmq.Context.instance().socket(zmq.PUSH)
    guard = frames.ReplayGuard()
    try:
        zap.present(out, "streams")
        out.connect(address)
        head = frames._chunk_head(frames._keys[b"streams"], b"streams", b"w" * 16, b"m", stream.MIN_BYTES, 0)
        out.send_multipart([head, bytes(stream.CHUNK_BYTES)])
        with pytest.raises(frames.Absorbed):  # its sender died after this chunk
            frames.decode(sockets.recv_frames(inbox), guard)
        assert len(guard.streams) == 1
        real_monotonic = time.monotonic

        def later():  # each idle step of the wait takes a quarter of STALE_S
            now[0] += stream.STALE_S / 4
            return now[0]

        monkeypatch.setattr(stream, "_now", later)

        def next_message():
            wait_until(lambda: not guard.streams, 30)  # (before the fix: 30 s, then the test fails)
            out.send_multipart(frames.encode("streams", {"k": "next"}))

        sender = threading.Thread(target=next_message)
        sender.start()
        started = real_monotonic()
        message = frames.decode(sockets.recv_frames(inbox), guard)
        sender.join()
        assert len(guard.streams) == 0 and message.header == {"k": "next"}
        assert real_monotonic() - started < 30
    finally:
        out.close(0)
        inbox.close(0)


def test_a_half_stream_of_an_async_actor_is_dropped_after_its_inbox_idled_stale_s(value):
    """An async actor's loop never blocks in recv_frames: it counts the idle time itself,
    every IDLE_CHECK_S, once what waits in its inbox is read."""
    from monarch_nb.proc.async_actor import AsyncServer

    class NoActor:  # the server's actor thread, as far as reading its inbox needs one
        failures: collections.deque = collections.deque()

    inbox, address = sockets.bind_inbox()
    out = zmq.Context.instance().socket(zmq.PUSH)
    server = AsyncServer(NoActor(), inbox, None)
    try:
        server._stopped = server.loop.create_future()
        zap.present(out, "streams")
        out.connect(address)
        head = frames._chunk_head(frames._keys[b"streams"], b"streams", b"a" * 16, b"m", stream.MIN_BYTES, 0)
        out.send_multipart([head, bytes(stream.CHUNK_BYTES)])  # its sender dies after this chunk
        assert wait_until(lambda: (server._readable(), len(server.guard.streams))[1] == 1, 30)
        server._count_idle()  # just read: nothing counts yet
        assert len(server.guard.streams) == 1
        server._drained_at -= stream.STALE_S + 1  # then the inbox waited for nothing that long
        server._count_idle()
        assert len(server.guard.streams) == 0
    finally:
        server.loop.close()
        out.close(0)
        inbox.close(0)


def test_a_stream_with_no_memory_left_for_it_is_dropped_and_the_inbox_goes_on(value, monkeypatch):
    def no_memory(kind, size):
        raise MemoryError()

    monkeypatch.setattr(stream, "_allocate", no_memory)
    guard, before = frames.ReplayGuard(), frames.dropped()
    with pytest.raises(frames.BadMessage, match="no room"):
        _chunk(guard, b"n" * 16, stream.MIN_BYTES)
    assert len(guard.streams) == 0 and frames.dropped() == before + 1
    monkeypatch.undo()
    assert np.array_equal(receive(routed(frames.encode_value("streams", {}, value, sign_at_send=True)),
                                  guard).value(), value)
