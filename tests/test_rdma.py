"""monarch_nb.rdma: Monarch's RDMABuffer API over this host's memory and TCP."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from monarch_nb import rdma
from monarch_nb.errors import SupervisionError
from monarch_nb.rdma import RDMAAction, RDMABuffer
from conftest import pid_gone, wait_until
from rdma_actors import Holder, Registered

_EXPECTED = bytes(bytearray(range(256)) * 4096)


@pytest.fixture(scope="module")
def holders(host):
    procs = host.spawn_procs(per_host={"gpus": 2}, name="rdma")
    yield procs.spawn("holders", Holder)
    procs.stop()


@pytest.fixture(params=["shm", "tcp"])
def backend(request, monkeypatch):
    if request.param == "shm" and rdma.get_rdma_backend() != "shm":
        pytest.skip("processes of this host can't read each other's memory here")
    monkeypatch.setattr(rdma, "_BACKEND", request.param)  # this process reads through it
    return request.param


def test_a_buffer_an_actor_owns_is_read_and_written_one_sided(holders, backend):
    owner = holders.slice(gpus=0)
    buffer = owner.create.call_one().get()
    assert buffer.size() == len(_EXPECTED) and buffer.backend == backend
    dst = torch.zeros(len(_EXPECTED), dtype=torch.uint8)
    assert buffer.read_into(dst).get(timeout=30) is None
    assert bytes(dst.numpy()) == _EXPECTED
    src = bytearray(b"\x07" * 1000)
    buffer.write_from(memoryview(src)).get(timeout=30)
    assert owner.contents.call_one().get()[:1001] == b"\x07" * 1000 + _EXPECTED[1000:1001]


def test_tcp_transfers_in_many_chunks_land_each_chunk_in_its_place(holders, monkeypatch):
    monkeypatch.setattr(rdma, "_BACKEND", "tcp")
    monkeypatch.setattr(rdma, "TCP_CHUNK", 100_000)  # 1 MiB: 10 full chunks and a short one, 4 in flight
    owner = holders.slice(gpus=0)
    buffer = owner.create.call_one().get()
    dst = torch.zeros(len(_EXPECTED), dtype=torch.uint8)
    buffer.read_into(dst).get(timeout=30)
    assert bytes(dst.numpy()) == _EXPECTED
    src = bytes(range(251)) * 1200  # 301,200 bytes: 3 full chunks and a short one
    buffer.write_from(memoryview(src)).get(timeout=30)
    assert owner.contents.call_one().get() == src + _EXPECTED[len(src):]


def test_an_actor_reads_a_buffer_the_client_owns_and_one_another_actor_owns(holders):
    weights = torch.arange(1 << 18, dtype=torch.float32)
    mine = RDMABuffer(weights.view(torch.uint8))
    assert holders.slice(gpus=1).read.call_one(mine).get(timeout=30) == bytes(weights.numpy())
    theirs = holders.slice(gpus=0).create.call_one().get()
    assert holders.slice(gpus=1).read.call_one(theirs).get(timeout=30) == _EXPECTED
    mine.drop()


def test_an_action_batches_reads_and_writes(holders):
    buffer = holders.slice(gpus=0).create.call_one().get()
    first, second = bytearray(buffer.size()), bytearray(buffer.size())
    RDMAAction().read_remote(memoryview(first), buffer).read_remote(memoryview(second), buffer) \
        .submit(timeout=30).get(timeout=30)
    assert bytes(first) == bytes(second) == _EXPECTED


def test_bad_memory_is_refused_at_once():
    with pytest.raises(ValueError, match="1-D"):
        RDMABuffer(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="1-D"):
        RDMABuffer(torch.zeros(8)[::2])
    with pytest.raises(ValueError, match="size 0"):
        RDMABuffer(memoryview(bytearray()))
    buffer = RDMABuffer(memoryview(bytearray(100)))
    with pytest.raises(ValueError, match="smaller"):
        buffer.read_into(memoryview(bytearray(10)))
    with pytest.raises(ValueError, match="larger"):
        buffer.write_from(memoryview(bytearray(200)))
    with pytest.raises(ValueError, match="read-only"):
        buffer.read_into(memoryview(bytes(100)))
    buffer.drop()


def test_a_buffer_keeps_its_tensors_memory_when_the_tensor_gets_another(holders, backend):
    # It kept the tensor, not its storage: `weights.data = new` freed the memory the
    # buffer named; a read returned freed heap, a write corrupted the owner's heap.
    weights = torch.arange(1 << 20, dtype=torch.int32).to(torch.uint8)
    buffer = RDMABuffer(weights)
    expected = bytes(weights.numpy())
    weights.data = torch.ones(4, dtype=torch.uint8)  # the old storage is the buffer's alone now
    assert holders.slice(gpus=1).read.call_one(buffer).get(timeout=30) == expected
    buffer.drop()


def test_a_buffer_over_read_only_memory_is_read_and_never_written(holders, backend):
    # A reader's write_from rewrote an immutable bytes object.
    frozen = bytes(range(256)) * 16
    buffer = RDMABuffer(memoryview(frozen))
    assert holders.slice(gpus=1).read.call_one(buffer).get(timeout=30) == frozen
    with pytest.raises(ValueError, match="read-only memory: it can be read, not written"):
        buffer.write_from(memoryview(bytearray(16)))
    assert frozen == bytes(range(256)) * 16
    buffer.drop()


def test_reading_a_dropped_buffer_fails(holders, backend):
    owner = holders.slice(gpus=0)
    buffer = owner.create.call_one().get()
    owner.drop.call_one().get()
    with pytest.raises(RuntimeError, match="dropped"):
        buffer.read_into(memoryview(bytearray(buffer.size()))).get(timeout=30)


def test_an_actors_buffers_end_with_it_and_readers_are_told_so(host, backend):
    # Before, a buffer an actor never dropped stayed registered, its memory held, for
    # the life of its proc: a notebook stopping and respawning meshes piled them up.
    procs = host.spawn_procs(per_host={"gpus": 1}, name="rdma_ends")
    try:
        owners, kept = procs.spawn("owners", Holder), procs.spawn("kept", Holder)
        watcher = procs.spawn("watcher", Registered)
        buffer, dropped_first = owners.create.call_one().get(), kept.create.call_one().get()
        kept.drop.call_one().get()
        survivor = kept.create.call_one().get()
        got = bytearray(buffer.size())
        buffer.read_into(memoryview(got)).get(timeout=30)
        assert bytes(got) == _EXPECTED and watcher.count.call_one().get() == 2
        owners.stop().get()
        assert watcher.count.call_one().get() == 1  # its proc lives on, without the stopped actor's buffer
        with pytest.raises(RuntimeError, match=r"dropped by its owner.*owners\[0\].*as it ended"):
            buffer.read_into(memoryview(got)).get(timeout=30)
        with pytest.raises(RuntimeError, match="dropped by its owner"):
            dropped_first.read_into(memoryview(got)).get(timeout=30)
        survivor.read_into(memoryview(got)).get(timeout=30)  # another actor's, in the same proc: untouched
        assert bytes(got) == _EXPECTED
        kept.stop().get()
        assert watcher.count.call_one().get() == 0
    finally:
        procs.stop()


def test_a_buffer_the_client_owns_outlives_every_actor(host):
    mine = RDMABuffer(memoryview(bytearray(b"c" * 64)))
    assert mine._actor is None
    procs = host.spawn_procs(per_host={"gpus": 1}, name="rdma_readers")
    try:
        readers = procs.spawn("readers", Holder)
        assert readers.read.call_one(mine).get() == b"c" * 64
        readers.stop().get()
        got = bytearray(64)
        mine.read_into(memoryview(got)).get(timeout=30)
        assert got == b"c" * 64
    finally:
        procs.stop()
        mine.drop()


def test_a_transfer_past_its_timeout_is_cancelled(holders):
    buffer = holders.slice(gpus=0).create.call_one().get()
    with pytest.raises(TimeoutError):
        buffer.read_into(memoryview(bytearray(buffer.size())), timeout=0).get(timeout=30)


def test_reading_from_a_dead_owner_raises_supervision_error(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="rdma_doomed")
    owner = procs.spawn("doomed", Holder)
    buffer = owner.create.call_one().get()
    pid = owner.pid.call_one().get()
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: pid_gone(pid), 10)
    with pytest.raises(SupervisionError):
        buffer.read_into(memoryview(bytearray(buffer.size()))).get(timeout=30)
    procs.stop()


def test_a_malformed_request_does_not_stop_the_owners_server(backend):
    from monarch_nb.protocol import envelope, rdma_ops
    from monarch_nb.wire import frames, sockets

    mine = RDMABuffer(memoryview(bytearray(b"z" * 100)))
    outbox = sockets.Outbox()
    outbox.send(mine._server, frames.encode(mine._cluster, {envelope.OP: rdma_ops.READ}))  # no reply route
    outbox.close_thread_sockets()
    got = bytearray(100)
    mine.read_into(memoryview(got)).get(timeout=30)
    assert got == b"z" * 100
    mine.drop()
