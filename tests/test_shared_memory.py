"""Large buffers between processes of one host go through shared memory (wire.shm):
they arrive intact and writable, and no segment outlives its message, its sender or
its cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from monarch_nb.wire import shm
from conftest import wait_until
from sample_actors import Arrays

SHM_MIN_BYTES = shm.MIN_BYTES  # the default (a fixture below raises it for a while)


def segments(cluster_id: str) -> list[str]:
    return shm._segments(cluster_id)


@pytest.fixture(scope="module")
def arrays(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="shm_arrays")
    yield procs.spawn("arrays", Arrays)
    procs.stop()


def test_large_arrays_round_trip_through_shared_memory_and_leave_no_segment(cluster, arrays):
    a = np.random.default_rng(0).integers(0, 2**20, size=shm.MIN_BYTES // 4, dtype=np.int32)
    back = arrays.echo.call_one(a).get(timeout=60)
    assert np.array_equal(back, a)
    back[0] = 7  # a mapped segment is an ordinary writable array here
    assert arrays.scaled.call_one(a, 2).get(timeout=60)[1] == a[1] * 2
    assert segments(cluster._info["cluster_id"]) == []


def test_without_shared_memory_calls_go_through_the_socket_with_one_warning(arrays, monkeypatch):
    monkeypatch.setattr(shm, "SHM_DIR", "/nonexistent/monarch_nb_shm")
    monkeypatch.setattr(shm, "_warned", False)
    data = bytes(range(256)) * (shm.MIN_BYTES // 256)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert arrays.checksum.call_one(np.frombuffer(data, np.uint8)).get(timeout=60)[3] == sum(range(256)) * (shm.MIN_BYTES // 256)
    assert len([w for w in caught if "shared memory" in str(w.message)]) == 1


def test_a_segment_whose_sender_died_untaken_is_swept_by_the_host_agent(cluster, arrays):
    cluster_id = cluster._info["cluster_id"]
    # A sender that wrote a segment and was killed before sending it.
    code = ("import sys; from monarch_nb.wire import shm; "
            "print(shm._put(sys.argv[1], b'x' * 4096), flush=True)")
    name = subprocess.run([sys.executable, "-c", code, cluster_id], capture_output=True, text=True,
                          check=True).stdout.strip()
    path = os.path.join(shm.SHM_DIR, name)
    old = time.time() - shm.SWEEP_AFTER_S - 1
    os.utime(path, (old, old))  # as if written long ago
    assert wait_until(lambda: not os.path.exists(path), 4 * 5.0)


def test_a_segment_whose_receiver_is_gone_is_swept_while_its_sender_lives(cluster):
    import socket

    cluster_id = cluster._info["cluster_id"]
    with socket.socket() as probe:  # a port nobody listens on once this closes
        probe.bind(("127.0.0.1", 0))
        gone_port = probe.getsockname()[1]
    live_port = int(cluster._info["hub"].rpartition(":")[2])
    gone = shm._put(cluster_id, b"x" * 4096, shm._new_name(cluster_id, gone_port))  # a kernel restarted
    live = shm._put(cluster_id, b"x" * 4096, shm._new_name(cluster_id, live_port))  # a busy receiver
    old = time.time() - shm.SWEEP_AFTER_S - 1
    for name in (live, gone):  # live first: a sweep that finds gone old finds live old too
        os.utime(os.path.join(shm.SHM_DIR, name), (old, old))  # as if sent long ago
    try:
        assert wait_until(lambda: gone not in segments(cluster_id), 4 * 5.0)
        assert live in segments(cluster_id)  # swept by the same pass: its receiver still listens
    finally:
        shm._unlink(live)


def test_cluster_stop_removes_every_segment_of_the_cluster():
    from monarch_nb.client.cluster import Cluster

    other = Cluster.start_ephemeral()
    cluster_id = other._info["cluster_id"]
    name = shm._put(cluster_id, b"y" * 4096)  # this live process's: no sweep would take it
    assert segments(cluster_id) == [name]
    other.stop()
    assert wait_until(lambda: segments(cluster_id) == [], 10)


def test_a_malformed_descriptor_or_one_naming_a_foreign_or_missing_segment_is_dropped():
    from monarch_nb.wire import frames

    frames.register_key("shm-test", b"k" * 32)
    good = frames.encode("shm-test", {"a": 1}, b"", [bytes(shm.MIN_BYTES)])
    sent = shm.offload("tcp://127.0.0.1:1", "shm-test", good, frames.FIXED_FRAMES)
    assert bytes(sent[0]).startswith(shm.MARKER)
    assert len(frames.decode(list(sent), frames.ReplayGuard()).buffers[0]) == shm.MIN_BYTES
    before = frames.dropped()
    with pytest.raises(frames.BadMessage):  # taken already: the segment is gone
        frames.decode(list(sent), frames.ReplayGuard())
    foreign = [shm.MARKER + b"3 4096 m shm mnb-0000000000000000-1-0000000000000000", *good]
    with pytest.raises(frames.BadMessage, match="not one of this process's clusters"):
        frames.decode(foreign, frames.ReplayGuard())
    for garbage in (b"3 x", b"\xff\xfe", b"", b"3 4096 z shm x", b"3 4096 b pieces 9"):
        with pytest.raises(frames.BadMessage, match="malformed"):
            frames.decode([shm.MARKER + garbage, *good], frames.ReplayGuard())
    with pytest.raises(frames.BadMessage, match="missing or incomplete"):  # a stream that never came
        frames.decode([shm.MARKER + b"3 4096 m stream " + b"00" * 16, *good], frames.ReplayGuard())
    assert frames.dropped() == before + 8


def test_segments_sent_to_a_peer_known_gone_are_unlinked_by_the_sender():
    from monarch_nb.wire import frames, sockets

    frames.register_key("shm-gone", b"k" * 32)
    encoded = frames.encode("shm-gone", {}, b"", [bytes(shm.MIN_BYTES)])
    address = "tcp://127.0.0.1:9"  # nobody reads it
    shm.offload(address, "shm-gone", encoded, frames.FIXED_FRAMES)
    assert len(segments("shm-gone")) == 1
    sockets.Outbox.discard(address)
    assert segments("shm-gone") == []


@pytest.fixture
def reply_path(arrays, request):
    """Both ends send large buffers through shared memory ("shm") or the socket ("socket")."""
    min_bytes = shm.MIN_BYTES if request.param == "shm" else 1 << 62
    before = arrays.set_shm_min_bytes.call_one(min_bytes).get(timeout=60)
    client_before, shm.MIN_BYTES = shm.MIN_BYTES, min_bytes
    yield request.param
    shm.MIN_BYTES = client_before
    arrays.set_shm_min_bytes.call_one(before).get(timeout=60)


@pytest.mark.parametrize("reply_path", ["shm", "socket"], indirect=True)
@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_large_bytes_bytearray_and_memoryview_arrive_intact_as_their_type_both_ways(cluster, arrays, reply_path, kind):
    # Over MIN_BYTES (a segment) and over stream.MIN_BYTES with a ragged end (chunks on the socket).
    from monarch_nb.wire import stream

    size = max(SHM_MIN_BYTES, 2 * stream.MIN_BYTES) + 4097
    data = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    value = kind(data.tobytes()) if kind is not memoryview else memoryview(data)
    assert arrays.type_of.call_one(value).get(timeout=60) == [kind.__name__]
    back = arrays.echo.call_one(value).get(timeout=60)
    assert type(back) is kind and back == value
    if kind is not bytes:
        back[0] ^= 1  # the caller's own, writable
        assert back != value
    assert segments(cluster._info["cluster_id"]) == []


def test_a_tampered_segment_is_dropped_before_unpickling(monkeypatch):
    from monarch_nb.wire import frames

    monkeypatch.setattr(shm, "MIN_BYTES", 1 << 16)
    frames.register_key("shm-tamper", b"k" * 32)
    value = np.random.default_rng(2).integers(0, 256, 256000, np.uint8).tobytes()
    encoded = frames.encode_value("shm-tamper", {}, value)
    before = frames.dropped()
    sent = shm.offload("tcp://127.0.0.1:5", "shm-tamper", encoded, frames.FIXED_FRAMES)
    name = bytes(sent[0]).decode().rpartition(" ")[2]
    with open(os.path.join(shm.SHM_DIR, name), "r+b") as f:  # another process of this user writes it
        f.write(b"\xff")
    with pytest.raises(frames.BadMessage, match="bad signature"):
        frames.decode(list(sent), frames.ReplayGuard())
    assert frames.dropped() == before + 1
    assert segments("shm-tamper") == []


def test_a_frame_set_signed_at_its_send_names_its_segments_and_hashes_only_what_goes_on_a_socket(monkeypatch):
    from monarch_nb.wire import frames

    monkeypatch.setattr(shm, "MIN_BYTES", 1 << 20)
    frames.register_key("shm-named", b"k" * 32)
    value = np.random.default_rng(3).integers(0, 256, 2 << 20, np.uint8)
    hashed = []
    real = frames.blake3.blake3

    def counting(*args, **kwargs):
        hashed.append(1)
        return real(*args, **kwargs)

    counting.AUTO = real.AUTO
    monkeypatch.setattr(frames.blake3, "blake3", counting)
    encoded = frames.encode_value("shm-named", {}, value, sign_at_send=True)  # as a call's arguments are

    def no_stream(*args):
        raise AssertionError("a frame of this size is not streamed")

    local = frames.route("tcp://127.0.0.1:5", encoded, no_stream)
    assert b" seg " in bytes(local[0])
    assert np.array_equal(frames.decode(list(local), frames.ReplayGuard()).value(), value)
    assert hashed == []  # a segment's contents: neither side hashes them
    remote = [frames.route(f"tcp://10.0.0.{n}:5", encoded, no_stream) for n in (1, 2)]
    assert len(hashed) == 1  # to other hosts: hashed once for every send of the frame set
    assert np.array_equal(frames.decode(list(remote[0]), frames.ReplayGuard()).value(), value)

    before = frames.dropped()
    first, second = (frames.route("tcp://127.0.0.1:5", encoded, no_stream) for _ in range(2))
    with pytest.raises(frames.BadMessage, match="bad signature"):  # one send's signature, another's segment
        frames.decode([second[0], *first[1:]], frames.ReplayGuard())
    assert np.array_equal(frames.decode(list(first), frames.ReplayGuard()).value(), value)  # the real one still arrives
    third = frames.route("tcp://127.0.0.1:5", encoded, no_stream)
    with pytest.raises(frames.BadMessage, match="bad signature"):  # named segment passed off as a hashed one
        frames.decode([bytes(third[0]).replace(b" seg ", b" shm "), *third[1:]], frames.ReplayGuard())
    assert frames.dropped() == before + 2
    assert segments("shm-named") == []


def test_large_calls_racing_their_actors_stop_leave_no_segment(cluster, host):
    # The news that the actors are gone can come while a call's segment is being written:
    # the segment must still be unlinked (it stayed until the cluster stopped).
    import threading

    procs = host.spawn_procs(per_host={"gpus": 1}, name="shm_race")
    big = np.ones(32 << 20, np.uint8)
    try:
        for trial in range(3):
            mesh = procs.spawn(f"race{trial}", Arrays)
            outcomes = []

            def keep_calling():
                for _ in range(60):
                    try:
                        mesh.type_of.call_one(big).get(timeout=60)
                        outcomes.append("ok")
                    except Exception as e:  # noqa: BLE001 - the stop's SupervisionError ends it
                        outcomes.append(type(e).__name__)
                        return

            caller = threading.Thread(target=keep_calling)
            caller.start()
            assert wait_until(lambda: len(outcomes) > trial, 60)  # stopped in the middle of the stream
            mesh.stop()
            caller.join(120)
            assert outcomes[-1] == "SupervisionError", outcomes
            assert wait_until(lambda: segments(cluster._info["cluster_id"]) == [], 15), \
                f"trial {trial}: segments left after the stop"
    finally:
        procs.stop()


@pytest.mark.parametrize("make", [lambda rng: rng.integers(0, 256, 2 << 20, np.uint8),
                                  lambda rng: rng.bytes(2 << 20)], ids=["array", "bytes"])
def test_one_frame_to_several_receivers_of_this_host_is_written_once_and_each_gets_its_own_value(
        monkeypatch, make):
    # What a router does with a call's large argument for its host's actors (shm.sharing).
    from monarch_nb.wire import frames

    monkeypatch.setattr(shm, "MIN_BYTES", 1 << 20)
    frames.register_key("shm-shared", b"k" * 32)
    value = make(np.random.default_rng(5))
    encoded = frames.encode_value("shm-shared", {}, value, sign_at_send=True)
    writes = []
    real_put = shm._put
    monkeypatch.setattr(shm, "_put", lambda *args: writes.append(1) or real_put(*args))

    def no_stream(*args):
        raise AssertionError("a frame of this size is not streamed")

    with shm.sharing():
        sent = [frames.route(f"tcp://127.0.0.1:{port}", encoded, no_stream) for port in (5, 6, 7)]
        names = segments("shm-shared")
        assert len(names) == 4  # a name for each receiver, and the template for more
        assert len({os.stat(os.path.join(shm.SHM_DIR, n)).st_ino for n in names}) == 1  # one file
    assert writes == [1] and len(segments("shm-shared")) == 3
    assert all(b" lseg " in bytes(s[0]) for s in sent)
    received = [frames.decode(list(s), frames.ReplayGuard()).value() for s in sent]
    assert segments("shm-shared") == []
    if isinstance(value, np.ndarray):
        received[0][:] = 0  # a receiver writing into its array changes its own copy only
        assert np.array_equal(received[1], value) and np.array_equal(received[2], value)
        assert not received[0].any()
    else:
        assert received == [value] * 3  # none cut short by another's read


def test_a_large_argument_to_a_mesh_of_this_host_is_written_once_and_each_actor_gets_its_own_value(
        cluster, host, monkeypatch):
    # A call straight from the client (no router) to several actors of one host.
    procs = host.spawn_procs(per_host={"gpus": 3}, name="shm_once")
    try:
        mesh = procs.spawn("arrays", Arrays)
        array = np.arange(2 * shm.MIN_BYTES // 8, dtype=np.int64)
        writes = []
        real_put = shm._put
        monkeypatch.setattr(shm, "_put", lambda *args: writes.append(1) or real_put(*args))
        sums = mesh.sum_then_zero.call(array).get(timeout=60).values()
        assert sums == [int(array.sum())] * 3  # no actor saw another's zeros
        assert writes == [1]
        assert array[1] == 1  # the caller's own array is untouched
        assert wait_until(lambda: segments(cluster._info["cluster_id"]) == [], 10)
    finally:
        procs.stop()


def test_a_peer_is_local_on_loopback_or_on_an_address_of_this_network_namespace():
    # The procs of a Slurm node bind on its routable address: they still share its memory.
    import psutil

    own = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
           if a.family.name == "AF_INET" and not a.address.startswith("127.")]
    assert shm.is_local("tcp://127.0.0.1:4000") and shm.is_local("tcp://127.0.3.9:4000")
    for address in own:
        assert shm.is_local(f"tcp://{address}:4000")
    assert not shm.is_local("tcp://198.51.100.77:4000")  # TEST-NET-2: no interface of ours has it
