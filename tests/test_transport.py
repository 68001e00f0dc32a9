"""Wire transport: signatures, out-of-band buffers, large tensors and arrays."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest
import torch
import zmq

from monarch_nb.wire import frames, serialize, zap
from conftest import wait_until
from sample_actors import Arrays

_MiB = 1 << 20


def test_tampered_or_resplit_frames_are_rejected():
    frames.register_key("t", b"k" * 32)
    good = frames.encode("t", {"a": 1}, b"body", [b"buffer"])
    assert frames.decode(good, frames.ReplayGuard()).header == {"a": 1}
    before = frames.dropped()
    tampered = list(good)
    tampered[2] = b"bodY"
    resplit = good[:2] + [b"bo", b"dybuffer"]
    forged = [b"MNB1" + b"\0" * 32 + b"t", *good[1:]]
    for bad in (tampered, resplit, forged, [b"MNB1t", *good[1:]]):
        with pytest.raises(frames.BadMessage):
            frames.decode(bad, frames.ReplayGuard())
    assert frames.dropped() == before + 4


def test_a_small_message_travels_as_one_frame_that_is_checked_like_three():
    frames.register_key("t", b"k" * 32)
    good = frames.encode("t", {"a": 1}, b"body")
    packed = frames.pack(good)
    message = frames.decode([packed], frames.ReplayGuard())
    assert (message.header, bytes(message.body)) == ({"a": 1}, b"body")
    lengths_at = len(frames.PACKED)
    before = frames.dropped()
    bad = [
        packed[:-1] + b"Y",  # the body changed
        packed[:lengths_at] + (1 << 30).to_bytes(4, "little") + packed[lengths_at + 4:],  # a length too long
        packed[:lengths_at + 3],  # cut inside the lengths
        packed[:lengths_at] + (len(good[0]) - 1).to_bytes(4, "little") + packed[lengths_at + 4:],  # resplit
    ]
    for frame in bad:
        with pytest.raises(frames.BadMessage):
            frames.decode([frame], frames.ReplayGuard())
    assert frames.dropped() == before + len(bad)
    guard = frames.ReplayGuard()
    frames.decode([packed], guard)
    with pytest.raises(frames.BadMessage, match="replayed"):
        frames.decode([packed], guard)


def test_a_lone_frame_that_is_no_packed_frame_set_is_dropped():
    frames.register_key("t", b"k" * 32)
    packed = frames.pack(frames.encode("t", {"a": 1}, b"body"))
    at = len(frames.PACKED) + 8  # where the packed prefix starts
    before = frames.dropped()
    bad = [
        b"MNB1" + packed[4:],  # not the packed marker
        packed[:at] + b"XXXX" + packed[at + 4:],  # a prefix without the frame set's magic
        packed + bytes(2 * frames.shm.MIN_BYTES + 4096),  # larger than any packed frame: refused uncopied
        packed[:at + 40],  # cut inside its prefix
    ]
    for frame in bad:
        with pytest.raises(frames.BadMessage):
            frames.decode([frame], frames.ReplayGuard())
    assert frames.dropped() == before + len(bad)


def test_the_small_message_path_signs_as_the_general_one():
    # encode writes most messages out on a path of its own (bytes, no buffers): what it
    # makes must be what the general path (a memoryview body) makes, frame for frame
    # but the stamp, and both are checked alike, packed or not.
    frames.register_key("t", b"k" * 32)
    for body in (None, b"", b"body", bytes(10_000)):
        fast = frames.encode("t", {"a": 1}, body)
        general = frames.encode("t", {"a": 1}, memoryview(body) if body is not None else None, [])
        assert [bytes(f) for f in fast[1:]] == [bytes(f) for f in general[1:]]
        for made in (fast, general):
            for sent in (made, [frames.pack(made)]):
                message = frames.decode(sent, frames.ReplayGuard())
                assert message.header == {"a": 1} and bytes(message.body or b"") == (body or b"")


def test_a_large_buffer_changed_by_one_byte_or_moved_between_frames_is_rejected():
    frames.register_key("t", b"k" * 32)
    big = bytearray(frames.BLAKE3_MIN_BYTES * 3)
    good = frames.encode("t", {"a": 1}, b"body", [bytes(big), b"tail"])
    assert memoryview(frames.decode(good, frames.ReplayGuard()).buffers[0]).nbytes == len(big)
    big[len(big) // 2] = 1
    flipped = [*good[:3], bytes(big), good[4]]
    moved = [*good[:3], good[3][:-4], good[3][-4:] + good[4]]
    before = frames.dropped()
    for bad in (flipped, moved):
        with pytest.raises(frames.BadMessage, match="bad signature"):
            frames.decode(bad, frames.ReplayGuard())
    assert frames.dropped() == before + 2


def test_a_replayed_frame_set_is_refused_by_the_inbox_that_saw_it():
    frames.register_key("t", b"k" * 32)
    guard = frames.ReplayGuard()
    first, second = frames.encode("t", {"n": 1}), frames.encode("t", {"n": 2})
    # Out of order within the window is fine; each is accepted once, by each inbox.
    assert frames.decode(second, guard).header == {"n": 2}
    assert frames.decode(first, guard).header == {"n": 1}
    assert frames.decode(first, frames.ReplayGuard()).header == {"n": 1}
    before = frames.dropped()
    for replay in (first, second, first):
        with pytest.raises(frames.BadMessage, match="replayed"):
            frames.decode(replay, guard)
    assert frames.dropped() == before + 3


def test_frames_too_far_behind_their_sender_or_older_than_the_inbox_are_refused(monkeypatch):
    frames.register_key("t", b"k" * 32)
    guard = frames.ReplayGuard()
    old = frames.encode("t", {"n": 0})
    for _ in range(frames.REPLAY_WINDOW):
        frames.decode(frames.encode("t", {}), guard)
    with pytest.raises(frames.BadMessage, match="replayed"):
        frames.decode(old, guard)  # never seen, but too far behind to tell
    # An inbox that did not exist when a frame set was made (a restarted actor at the
    # same address) refuses it: it can only be a capture.
    captured = frames.encode("t", {"n": 1})
    monkeypatch.setattr(frames.time, "time", lambda: 1e10)
    with pytest.raises(frames.BadMessage, match="replayed"):
        frames.decode(captured, frames.ReplayGuard())


def test_a_signed_header_that_is_not_a_dict_is_dropped_and_counted():
    frames.register_key("t", b"k" * 32)
    before = frames.dropped()
    for header in (["op"], None):
        bad = frames.encode("t", header)
        with pytest.raises(frames.BadMessage):
            frames.decode(bad, frames.ReplayGuard())
    assert frames.dropped() == before + 2


def test_a_late_reply_to_a_dead_inbox_does_not_answer_the_request_of_the_one_that_took_its_address():
    # A hub SIGKILLed while an agent handled its spawn, then recovered at the same
    # address: the agent's late spawn reply reached the new hub and answered its first
    # request (adopt), since both used reply port 1; the recovery failed.
    import asyncio

    from monarch_nb.protocol import envelope
    from monarch_nb.wire.aio import AioEndpoint

    frames.register_key("late", b"k" * 32)

    async def scenario():
        peer = AioEndpoint("late")
        dead = AioEndpoint("late")
        port, never = dead.expect()
        never.close()
        await dead.send(peer.address, {"op": "spawn", envelope.PORT: port, envelope.REPLY: dead.address})
        stale = (await peer.recv()).header
        address = dead.address
        dead.close()
        reborn = AioEndpoint("late", prefer=address)
        assert reborn.address == address
        await peer.reply(stale, answer="to the dead one's spawn")  # queued to the address first
        asked = asyncio.ensure_future(reborn.request(peer.address, {"op": "adopt"}, timeout=30))

        async def serve():
            while True:
                message = await reborn.recv()
                reborn.deliver_reply(message)

        server = asyncio.ensure_future(serve())
        request = (await peer.recv()).header
        assert request["op"] == "adopt"
        await peer.reply(request, answer="to adopt")
        try:
            return (await asyncio.wait_for(asked, 30)).header["answer"]
        finally:
            server.cancel()
            for endpoint in (peer, reborn):
                endpoint.close()

    assert asyncio.run(scenario()) == "to adopt"


def test_numpy_and_torch_travel_out_of_band():
    arr = np.arange(1 << 16, dtype=np.float32)
    t = torch.arange(1 << 16, dtype=torch.float32)
    stream, buffers = serialize.dumps((arr, t))
    assert len(buffers) == 2 and len(stream) < 4096  # the data is not in the pickle stream
    arr2, t2 = serialize.loads(stream, [b.raw() for b in buffers])
    assert np.array_equal(arr, arr2) and torch.equal(t, t2)


def test_bytes_bytearray_and_memoryview_travel_out_of_band_and_keep_their_type():
    big = bytes(range(256)) * 1024  # 256 KiB
    grid = memoryview(np.arange(1 << 15, dtype=np.float64).reshape(8, -1))
    value = (big, bytearray(big), grid, b"small", big)
    stream, buffers = serialize.dumps(value)
    assert len(buffers) == 3 and len(stream) < 4096  # the same bytes object twice: one buffer
    got = serialize.loads(stream, [memoryview(bytearray(b.raw())) for b in buffers])
    assert [type(v) for v in got] == [bytes, bytearray, memoryview, bytes, bytes]
    assert got[0] == big and got[1] == big and got[3] == b"small" and got[4] == big
    assert (got[2].format, got[2].shape, got[2].tolist()) == ("d", (8, 4096), grid.tolist())
    assert not got[2].readonly and got[2].obj is not None


def test_builtin_data_round_trips_with_its_types_and_large_bytes_inside_still_go_out_of_band():
    small = {"step": 1, 2: (None, True, 2.5, "s", b"b", bytearray(b"ba")), "xs": [1.0, [2, (3,)]]}
    stream, buffers = serialize.dumps(small)
    assert not buffers and serialize.loads(stream) == small
    back = serialize.loads(stream)
    assert [type(v) for v in back[2]] == [type(None), bool, float, str, bytes, bytearray]
    assert type(back["xs"][1][1]) is tuple
    big = bytes(1 << 17)
    stream, buffers = serialize.dumps({"small": small, "big": [big]})
    assert len(buffers) == 1 and len(stream) < 4096
    assert serialize.loads(stream, [b.raw() for b in buffers])["big"][0] == big
    loop: list = []
    loop.append(loop)
    back = _round_trip(loop)
    assert back[0] is back


def test_small_and_strided_memoryviews_round_trip():
    for view in (memoryview(b"abc"), memoryview(bytes(200_000))[::2], memoryview(bytearray(b"xy"))):
        back = _round_trip(view)
        assert (back.format, back.shape, back.tolist(), back.readonly) == (
            view.format, view.shape, view.tolist(), view.readonly)


def test_a_memoryview_that_cannot_be_rebuilt_is_refused_at_send_and_an_empty_one_travels():
    # Sent, it failed in the actor before the endpoint ran (or its reply could not be read).
    from monarch_nb.errors import SerializationError

    for view in (memoryview(np.arange(4, dtype=">f8")), memoryview(np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")])),
                 memoryview(np.zeros((0, 5)))):
        with pytest.raises(SerializationError, match="can't be rebuilt where it arrives; send bytes"):
            serialize.dumps({"weights": view})
    for empty in (memoryview(b""), memoryview(np.zeros(0))):
        back = _round_trip(empty)
        assert (back.format, back.shape) == (empty.format, (0,))


def _round_trip(obj):
    stream, buffers = serialize.dumps(obj)
    return serialize.loads(stream, [b.raw() for b in buffers])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int64, torch.bool])
def test_torch_dtypes_and_grad_flag_survive(dtype):
    t = (torch.arange(100) % 3).to(dtype)
    back = _round_trip(t)
    assert back.dtype == dtype and torch.equal(back, t)
    g = torch.ones(4, requires_grad=True)
    back = _round_trip(g)
    assert back.requires_grad and torch.equal(back.detach(), g.detach())


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta", "ignore:The PyTorch API of nested tensors")
def test_tensors_stock_pickle_sends_travel_as_it_sends_them():
    # A conjugate view, a CSR tensor or a nested one failed with a bare RuntimeError
    # (numpy() refuses them); an expanded one became its contiguous copy (a 4 MiB message
    # for a tensor of 1 element: stock pickle sends 401 bytes).
    complex_ = torch.tensor([1 + 2j, 3 - 1j])
    for t in (complex_.conj(), torch.tensor([[0., 1.], [2., 0.]]).to_sparse_csr(),
              torch.tensor([1., 2.])._neg_view()):
        back = _round_trip(t)
        assert back.layout == t.layout and torch.equal(back.to_dense().resolve_conj().resolve_neg(),
                                                       t.to_dense().resolve_conj().resolve_neg())
    nested = _round_trip(torch.nested.nested_tensor([torch.arange(3.), torch.arange(2.)]))
    assert nested.is_nested and [x.tolist() for x in nested.unbind()] == [[0., 1., 2.], [0., 1.]]
    expanded = torch.zeros(1).expand(1 << 20)
    stream, buffers = serialize.dumps(expanded)
    assert len(stream) + sum(b.raw().nbytes for b in buffers) < 4096
    back = _round_trip(expanded)
    assert back.shape == expanded.shape and back.stride() == (0,) and not back.any()


def test_a_dense_tensor_in_another_memory_order_keeps_its_strides():
    # channels_last (what vision models train in) and transposes arrived as contiguous
    # copies: the receiver's convolutions then ran in another memory format, or it
    # converted back at a cost. Stock pickle keeps strides; so does this, with no copy.
    for t in (torch.randn(4, 3, 8, 8).to(memory_format=torch.channels_last),
              torch.randn(2, 3, 4, 8, 8).to(memory_format=torch.channels_last_3d),
              torch.randn(1, 3, 1, 64).to(memory_format=torch.channels_last),  # size-1 dims
              torch.randn(300, 200).t(), torch.randn(64, 64).bfloat16().t(),
              torch.randn(50, 40, requires_grad=True).t()):
        back = _round_trip(t)
        assert back.stride() == t.stride() and back.dtype == t.dtype and torch.equal(back.detach(), t.detach())
        assert back.requires_grad == t.requires_grad
    gapped = torch.randn(300, 200)[:, ::2]  # a slice with gaps: its elements only, not the storage around them
    stream, buffers = serialize.dumps(gapped)
    assert sum(b.raw().nbytes for b in buffers) == gapped.numel() * gapped.element_size()
    assert torch.equal(_round_trip(gapped), gapped)


@pytest.fixture(scope="module")
def arrays(host):
    procs = host.spawn_procs(per_host={"gpus": 2}, name="arrays")
    yield procs.spawn("arrays", Arrays)
    procs.stop()


def test_64mib_tensor_and_array_round_trip_uncorrupted(arrays):
    gen = torch.Generator().manual_seed(0)
    t = torch.randint(0, 255, (64 * _MiB,), dtype=torch.uint8, generator=gen)
    a = np.random.default_rng(0).integers(0, 2**31, size=16 * _MiB, dtype=np.int32)  # 64 MiB
    one = arrays.slice(gpus=1)
    expected_t = int(t.numpy().sum())
    assert one.checksum.call_one(t).get(timeout=60) == ("Tensor", "torch.uint8", (64 * _MiB,), expected_t)
    back = one.echo.call_one(t).get(timeout=60)
    assert torch.equal(back, t)
    back_a = one.echo.call_one(a).get(timeout=60)
    assert back_a.dtype == a.dtype and np.array_equal(back_a, a)
    back_a[0] = 7  # received arrays are ordinary writable arrays


def test_large_bytes_arguments_and_results_reach_the_endpoint_as_bytes(arrays):
    data = np.random.default_rng(1).bytes(8 * _MiB)
    one = arrays.slice(gpus=0)
    assert one.type_of.call_one(data, bytearray(data), memoryview(data)).get(timeout=60) == [
        "bytes", "bytearray", "memoryview"]
    back = one.echo.call_one(data).get(timeout=60)
    assert type(back) is bytes and back == data


def test_noncontiguous_and_strided_tensors_round_trip(arrays):
    t = torch.arange(64).reshape(8, 8).t()[::2]
    assert torch.equal(arrays.slice(gpus=0).echo.call_one(t).get(), t)
    assert torch.equal(arrays.slice(gpus=0).scaled.call_one(t, 2).get(), t * 2)
    images = torch.randn(8, 3, 64, 64).to(memory_format=torch.channels_last)  # 384 KiB: out of band
    back = arrays.slice(gpus=0).echo.call_one(images).get()
    assert back.is_contiguous(memory_format=torch.channels_last) and torch.equal(back, images)


def test_unsigned_and_badly_signed_messages_are_never_unpickled(arrays, tmp_path):
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    payload = pickle.dumps({"k": "call", "ep": "echo", "port": 1, "reply": "tcp://127.0.0.1:1"})
    body = pickle.dumps(((Exploit(),), {}))
    one = arrays.slice(gpus=0)
    address = one._addresses[one._shape.base_rank(0)]
    cid = one._cluster_id.encode()
    before = one.wire_stats.call_one().get()
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.PUSH)
    zap.present(sock, cid)  # admitted (wire.zap): every frame set's signature is still checked
    sock.connect(address)
    sock.send_multipart([b"MNB1" + b"\0" * 32 + cid, payload, body])             # bad signature
    sock.send_multipart([b"MNB1" + cid, payload, body])                         # no signature
    sock.send_multipart([payload, body])                                        # not our framing at all
    sock.send_multipart([b"MNB1" + b"\0" * 32 + b"other-cluster", payload, body])  # unknown key
    sock.close(linger=1000)
    # Another connection has no ordering with ours: wait for the count to move.
    assert wait_until(lambda: one.wire_stats.call_one().get() == before + 4, 10)
    assert not marker.exists()
    assert one.echo.call_one("still fine").get() == "still fine"


def test_sockets_to_vanished_peers_are_closed_once_idle(monkeypatch):
    from monarch_nb.wire import sockets

    monkeypatch.setattr(sockets, "IDLE_SOCKET_S", 0.05)
    monkeypatch.setattr(sockets, "_next_sweep", 0.0)
    outbox = sockets.Outbox()
    gone = "tcp://127.0.0.1:9"  # nothing listens: like a client whose kernel restarted
    outbox.send(gone, [b"x", b"h", b"b"])
    inbox, live = sockets.bind_inbox()
    frames.register_key("t", b"k" * 32)  # (a live inbox admits only a cluster's peers: wire.zap)
    try:
        def sweep():
            outbox.send(live, frames.encode("t", {}))
            return gone not in outbox._local.table.sockets

        assert wait_until(sweep, 5)
        assert live in outbox._local.table.sockets
    finally:
        inbox.close(0)
        outbox.forget(live)


def test_sockets_connected_ahead_and_never_sent_on_are_closed_once_idle_without_a_send(monkeypatch):
    # A host router connects to each new actor as it is bound (proc_ops.ANNOUNCE); a mesh
    # stopped uncalled left those sockets reconnecting to closed ports until the next call.
    from monarch_nb.wire import sockets

    monkeypatch.setattr(sockets, "IDLE_SOCKET_S", 0.05)
    monkeypatch.setattr(sockets, "_next_sweep", 0.0)
    frames.register_key("t", b"k" * 32)
    outbox = sockets.Outbox()
    gone = "tcp://127.0.0.1:9"
    outbox.connect([gone], b"t")
    assert gone in outbox._local.table.sockets

    def swept() -> bool:
        sockets.sweep_idle()
        return gone not in outbox._local.table.sockets

    assert wait_until(swept, 5)


def test_a_peer_known_gone_has_its_sockets_closed_in_every_thread_at_once():
    from monarch_nb.wire import sockets

    outbox = sockets.Outbox()
    gone = "tcp://127.0.0.1:9"
    tables = []

    def sender() -> None:  # sends once and never again, as a thread that made a call and went idle
        outbox.send(gone, [b"x", b"h", b"b"])
        tables.append(outbox._local.table)

    thread = threading.Thread(target=sender)
    thread.start()
    thread.join()
    outbox.send(gone, [b"x", b"h", b"b"])
    tables.append(outbox._local.table)
    assert all(gone in t.sockets for t in tables)
    sockets.Outbox.discard(gone)
    assert not any(gone in t.sockets for t in tables)


def test_a_wait_inside_a_reply_callback_drives_the_inbox_itself():
    # A done-callback that waits on another reply (a service retrying a call through
    # a host router that asks the hub for routes) ran on the thread driving the inbox;
    # its wait slept until that thread dispatched the reply: itself, so until its timeout.
    from monarch_nb.protocol import envelope
    from monarch_nb.wire.mailbox import Mailbox

    frames.register_key("nested", b"n" * 32)
    mailbox = Mailbox()
    inner_got: list = []
    outer_done: list = []

    def outer_arrived(_message) -> None:
        inner = mailbox.open_port(inner_got.append)
        mailbox.send(mailbox.address, frames.encode("nested", {envelope.PORT: inner}))
        outer_done.append(mailbox.wait(lambda: bool(inner_got), timeout=30))

    outer = mailbox.open_port(outer_arrived)
    mailbox.send(mailbox.address, frames.encode("nested", {envelope.PORT: outer}))
    assert mailbox.wait(lambda: bool(outer_done), timeout=60)
    assert outer_done == [True] and len(inner_got) == 1


def test_one_frame_set_sent_to_each_of_several_inboxes_reaches_each_once_small_or_large():
    from monarch_nb.wire import sockets

    frames.register_key("t", b"k" * 32)
    inboxes = [sockets.bind_inbox() for _ in range(3)]
    outbox = sockets.Outbox()
    small = frames.encode_value("t", {"n": 1}, "small")
    large = frames.encode_value("t", {"n": 2}, np.arange(1 << 18, dtype=np.int64))  # out of band: sent one by one
    try:
        for sent in (small, large):
            outbox.send_to_each([address for _, address in inboxes], sent)
        for inbox, _ in inboxes:
            guard = frames.ReplayGuard()
            got = []
            while len(got) < 2 and inbox.poll(30_000):
                got.append(frames.decode(sockets.recv_frames(inbox), guard))
            assert [m.header["n"] for m in got] == [1, 2]
            assert got[0].value() == "small" and (got[1].value() == np.arange(1 << 18)).all()
            assert not inbox.poll(100)  # nothing twice
    finally:
        for inbox, address in inboxes:
            outbox.forget(address)
            inbox.close(0)
