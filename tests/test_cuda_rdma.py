"""RDMABuffer over CUDA memory (issue 25 item 3). On a CPU machine the CUDA calls are a
fake (tests/cuda_fake.py) in this process and in the owner's proc: its "device memory"
is a memfd another process maps as CUDA IPC maps device memory, and its call log says
who copied what. The tests at the end run on a real GPU and skip without one."""

from __future__ import annotations

import os
import signal

import pytest

from monarch_nb import rdma
from monarch_nb.errors import SupervisionError
from monarch_nb.rdma import RDMABuffer, device
from monarch_nb.wire import cuda

torch = pytest.importorskip("torch")  # noqa: E402

from conftest import pid_gone, cuda_gpu_count, wait_until  # noqa: E402
from cuda_fake import FakeCuda  # noqa: E402
from rdma_actors import CudaHolder, FakeGpuHolder, Holder  # noqa: E402

_SIZE = 1 << 20
_EXPECTED = bytes(bytearray(range(256)) * 4096)

if rdma.get_rdma_backend() != "shm":  # CUDA IPC's liveness checks read the owner's memory one-sided
    pytest.skip("processes of this host can't read each other's memory here", allow_module_level=True)


@pytest.fixture(scope="module")
def holders(host):
    procs = host.spawn_procs(per_host={"procs": 2}, name="cuda_rdma")
    yield procs.spawn("holders", FakeGpuHolder)
    procs.stop()


@pytest.fixture
def owner(holders):
    owner = holders.slice(procs=0)
    yield owner
    owner.calls.call_one().get()  # cleared for the next test


@pytest.fixture
def fake():
    """This process's fake CUDA (one device)."""
    fake = FakeCuda(devices=1)
    old = cuda.use(fake)
    yield fake
    cuda.use(old)


@pytest.fixture(params=["cuda_ipc", "staged"])
def path(request, monkeypatch):
    """A CUDA buffer's two ways from a reader of its host: by CUDA IPC, or staged by its
    owner (as from another host) with MONARCH_NB_RDMA_CUDA_IPC=0."""
    if request.param == "staged":
        monkeypatch.setenv(device.IPC_ENV, "0")
    return request.param


def cuda_zeros(fake, nbytes: int = _SIZE):
    return fake.tensor(torch.zeros(nbytes, dtype=torch.uint8))


def kinds(calls) -> list[str]:
    return [c[0] for c in calls]


def test_by_ipc_a_reader_maps_the_buffer_once_and_no_owner_code_runs_per_read(owner, fake):
    buffer = owner.create.call_one().get()
    assert buffer.backend == "cuda_ipc" and buffer.size() == _SIZE
    assert kinds(owner.calls.call_one().get()) == ["ipc_share"]  # exported once, at creation
    dst, host = cuda_zeros(fake), torch.zeros(_SIZE, dtype=torch.uint8)
    for _ in range(2):
        buffer.read_into(dst).get(timeout=30)
    buffer.read_into(host).get(timeout=30)
    assert bytes(dst.numpy()) == bytes(host.numpy()) == _EXPECTED
    assert kinds(fake.calls) == ["ipc_map", "copy_on_device", "copy_on_device", "copy_to_host"]
    assert owner.calls.call_one().get() == []  # one-sided: the owner copied nothing


def test_by_ipc_a_write_lands_in_the_owners_device_memory(owner, fake):
    buffer = owner.create.call_one().get()
    buffer.write_from(fake.tensor(torch.full((1000,), 7, dtype=torch.uint8))).get(timeout=30)
    buffer.write_from(memoryview(b"\x09" * 10)).get(timeout=30)  # from host memory
    assert owner.contents.call_one().get() == b"\x09" * 10 + b"\x07" * 990 + _EXPECTED[1000:]
    assert kinds(fake.calls) == ["ipc_map", "copy_on_device", "copy_from_host"]
    assert kinds(owner.calls.call_one().get()) == ["ipc_share"]


def test_staged_the_owner_copies_each_chunk_through_pinned_memory(owner, fake, monkeypatch):
    monkeypatch.setattr(rdma, "_BACKEND", "tcp")  # as from another host
    monkeypatch.setattr(rdma, "TCP_CHUNK", 100_000)  # 1 MiB: 10 full chunks and a short one
    buffer = owner.create.call_one().get()
    assert buffer.backend == "tcp"
    owner.calls.call_one().get()
    dst = cuda_zeros(fake)
    buffer.read_into(dst).get(timeout=30)
    assert bytes(dst.numpy()) == _EXPECTED
    served = owner.calls.call_one().get()
    assert kinds(served) == ["pinned_buffer"] + ["copy_to_host"] * 11  # one staging buffer, kept
    assert [c[1] for c in served[1:]] == list(range(0, _SIZE, 100_000))
    assert kinds(fake.calls) == ["copy_from_host"] * 11  # each chunk to this device as it lands
    fake.calls.clear()
    src = fake.tensor(torch.tensor(list(range(251)) * 1200, dtype=torch.uint8))  # 3 full chunks and a short one
    buffer.write_from(src).get(timeout=30)
    assert owner.contents.call_one().get() == bytes(src.numpy()) + _EXPECTED[src.numel():]
    assert kinds(fake.calls) == ["pinned_buffer"] + ["copy_to_host"] * 4
    assert kinds(owner.calls.call_one().get()) == ["copy_from_host"] * 4


def test_with_ipc_off_a_reader_of_the_same_host_goes_staged(owner, fake, monkeypatch):
    monkeypatch.setenv(device.IPC_ENV, "0")
    buffer = owner.create.call_one().get()
    assert buffer.backend == "tcp"
    dst = cuda_zeros(fake)
    buffer.read_into(dst).get(timeout=30)
    assert bytes(dst.numpy()) == _EXPECTED and "ipc_map" not in kinds(fake.calls)
    assert "copy_to_host" in kinds(owner.calls.call_one().get())


def test_a_handle_that_does_not_open_here_goes_staged_and_is_not_tried_again(owner, fake):
    fake.ipc_opens = False  # another GPU this process can't map, a container without IPC
    buffer = owner.create.call_one().get()
    owner.calls.call_one().get()
    for _ in range(2):
        dst = cuda_zeros(fake)
        buffer.read_into(dst).get(timeout=30)
        assert bytes(dst.numpy()) == _EXPECTED
    assert kinds(fake.calls).count("ipc_map") == 1
    assert kinds(owner.calls.call_one().get()).count("copy_to_host") == 2


def test_a_buffer_ipc_cannot_share_is_served_staged(owner, fake):
    buffer = owner.create.call_one(shareable=False).get()
    assert buffer.backend == "tcp"  # the owner exported no handle
    dst = cuda_zeros(fake)
    buffer.read_into(dst).get(timeout=30)
    assert bytes(dst.numpy()) == _EXPECTED and "ipc_map" not in kinds(fake.calls)


def test_an_actor_reads_a_cuda_buffer_the_client_owns(holders, fake):
    weights = fake.shared(torch.arange(1 << 18, dtype=torch.float32))  # 1 MiB of float32
    mine = RDMABuffer(weights)
    assert mine.size() == 1 << 20
    assert holders.slice(procs=1).read.call_one(mine).get(timeout=30) == bytes(weights.view(torch.uint8).numpy())
    assert kinds(holders.slice(procs=1).calls.call_one().get()) == ["ipc_map", "copy_on_device"]
    mine.drop()


def test_a_cuda_tensor_that_requires_grad_is_moved_as_raw_memory(fake, path):
    weights = fake.shared(torch.arange(1000, dtype=torch.float32)).requires_grad_(True)
    mine = RDMABuffer(weights)
    dst = fake.tensor(torch.zeros(1000, dtype=torch.float32, requires_grad=True))
    mine.read_into(dst).get(timeout=30)
    mine.write_from(fake.tensor(torch.full((10,), -1.0))).get(timeout=30)
    assert torch.equal(dst.detach(), torch.arange(1000, dtype=torch.float32))
    assert weights[:11].tolist() == [-1.0] * 10 + [10.0] and weights.requires_grad and dst.requires_grad
    mine.drop()


@pytest.mark.parametrize("host_backend", ["shm", "tcp"])
def test_a_host_buffer_is_read_into_and_written_from_cuda_memory_staged(host, fake, monkeypatch, host_backend):
    monkeypatch.setattr(rdma, "_BACKEND", host_backend)
    monkeypatch.setattr(device, "STAGE_CHUNK", 300_000)  # 1 MiB on one host: 3 full chunks and a short one
    procs = host.spawn_procs(per_host={"procs": 1}, name=f"cuda_rdma_cpu_{host_backend}")
    try:
        owner = procs.spawn("holder", Holder)
        buffer = owner.create.call_one().get()
        dst = cuda_zeros(fake)
        buffer.read_into(dst).get(timeout=30)
        assert bytes(dst.numpy()) == _EXPECTED
        chunks = 4 if host_backend == "shm" else 1
        assert kinds(fake.calls) == (["pinned_buffer"] if host_backend == "shm" else []) + ["copy_from_host"] * chunks
        src = fake.tensor(torch.full((1000,), 3, dtype=torch.uint8))
        buffer.write_from(src).get(timeout=30)
        assert owner.contents.call_one().get()[:1001] == b"\x03" * 1000 + _EXPECTED[1000:1001]
    finally:
        procs.stop()


# Every error path of the host-memory backends (tests/test_rdma.py), for CUDA memory.

def test_bad_cuda_memory_is_refused_at_once(fake):
    with pytest.raises(ValueError, match="1-D"):
        RDMABuffer(fake.tensor(torch.zeros(4, 4)))
    with pytest.raises(ValueError, match="1-D"):
        RDMABuffer(fake.tensor(torch.zeros(8)[::2]))
    with pytest.raises(ValueError, match="size 0"):
        RDMABuffer(fake.tensor(torch.zeros(0)))
    buffer = RDMABuffer(fake.shared(torch.zeros(100, dtype=torch.uint8)))
    with pytest.raises(ValueError, match="smaller"):
        buffer.read_into(cuda_zeros(fake, 10))
    with pytest.raises(ValueError, match="larger"):
        buffer.write_from(cuda_zeros(fake, 200))
    buffer.drop()


def test_reading_a_dropped_cuda_buffer_fails(owner, fake, path):
    buffer = owner.create.call_one().get()
    owner.drop.call_one().get()
    with pytest.raises(RuntimeError, match="dropped"):
        buffer.read_into(cuda_zeros(fake)).get(timeout=30)


def test_a_cuda_buffer_dropped_after_a_read_fails_the_next_read_and_is_unmapped(owner, fake, path):
    buffer = owner.create.call_one().get()
    buffer.read_into(cuda_zeros(fake)).get(timeout=30)
    mapped = len(rdma._mappings)
    owner.drop.call_one().get()
    with pytest.raises(RuntimeError, match="dropped"):
        buffer.read_into(cuda_zeros(fake)).get(timeout=30)
    with pytest.raises(RuntimeError, match="dropped"):
        buffer.write_from(cuda_zeros(fake)).get(timeout=30)
    assert len(rdma._mappings) == (mapped - 1 if path == "cuda_ipc" else mapped)


def test_a_cuda_transfer_past_its_timeout_is_cancelled(owner, fake, path):
    buffer = owner.create.call_one().get()
    with pytest.raises(TimeoutError):
        buffer.read_into(cuda_zeros(fake), timeout=0).get(timeout=30)
    with pytest.raises(TimeoutError):
        buffer.write_from(cuda_zeros(fake), timeout=0).get(timeout=30)
    assert owner.contents.call_one().get() == _EXPECTED  # nothing written


def test_reading_a_cuda_buffer_of_a_dead_owner_raises_supervision_error(host, fake, path):
    procs = host.spawn_procs(per_host={"procs": 1}, name="cuda_rdma_doomed")
    try:
        owner = procs.spawn("doomed", FakeGpuHolder)
        buffer = owner.create.call_one().get()
        pid = owner.pid.call_one().get()
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: pid_gone(pid), 10)
        with pytest.raises(SupervisionError):
            buffer.read_into(cuda_zeros(fake)).get(timeout=30)
    finally:
        procs.stop()


# Real GPUs: skipped without one (the one allowed skip; run by bench/gpu_check.py).

@pytest.fixture(scope="module")
def gpu() -> int:
    count = cuda_gpu_count()
    if not count:
        pytest.skip("needs a CUDA GPU: torch.cuda.is_available() is False here")
    return count


def test_a_real_cuda_buffer_is_read_and_written_by_ipc_and_staged(gpu, host, monkeypatch):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="cuda_rdma_real")
    try:
        owner = procs.spawn("owner", CudaHolder)
        buffer = owner.create.call_one(1 << 20).get(timeout=120)
        expected = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
        for ipc in ("1", "0"):
            monkeypatch.setenv(device.IPC_ENV, ipc)
            assert buffer.backend == ("cuda_ipc" if ipc == "1" else "tcp")
            on_device, on_host = torch.zeros(1 << 20, device="cuda"), torch.zeros(1 << 20)
            buffer.read_into(on_device).get(timeout=60)
            buffer.read_into(on_host).get(timeout=60)
            assert torch.equal(on_device, expected) and torch.equal(on_host, expected.cpu())
            buffer.write_from(torch.full((4,), -float(ipc), device="cuda")).get(timeout=60)
            assert owner.head.call_one(5).get(timeout=60) == [-float(ipc)] * 4 + [4.0]
        assert rdma._mappings.unopened == 0  # the handle opened here: IPC, not staged
    finally:
        procs.stop()
