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
    assert frames.decode(list(sent), frames.ReplayGuard()).buffers[0].nbytes == shm.MIN_BYTES
    before = frames.dropped()
    with pytest.raises(frames.BadMessage):  # taken already: the segment is gone
        frames.decode(list(sent), frames.ReplayGuard())
    foreign = [shm.MARKER + b"3 4096 mnb-0000000000000000-1-0000000000000000", *good]
    with pytest.raises(frames.BadMessage, match="not one of this process's clusters"):
        frames.decode(foreign, frames.ReplayGuard())
    for garbage in (b"3 x", b"\xff\xfe", b""):
        with pytest.raises(frames.BadMessage, match="malformed"):
            frames.decode([shm.MARKER + garbage, *good], frames.ReplayGuard())
    assert frames.dropped() == before + 5


def test_segments_sent_to_a_peer_known_gone_are_unlinked_by_the_sender():
    from monarch_nb.wire import frames, sockets

    frames.register_key("shm-gone", b"k" * 32)
    encoded = frames.encode("shm-gone", {}, b"", [bytes(shm.MIN_BYTES)])
    address = "tcp://127.0.0.1:9"  # nobody reads it
    shm.offload(address, "shm-gone", encoded, frames.FIXED_FRAMES)
    assert len(segments("shm-gone")) == 1
    sockets.Outbox.discard(address)
    assert segments("shm-gone") == []
