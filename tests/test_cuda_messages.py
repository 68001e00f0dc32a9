"""CUDA tensors in messages (issue 25 item 2). On a CPU machine the CUDA calls are a fake
(tests/cuda_fake.py, put in use with ``wire.cuda.use``) and these tests check where a
tensor goes (staged, or by CUDA IPC: by default when every receiver is of this host),
what is kept and what is released; the tests at the end run on a real GPU and skip
without one."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings
import weakref

import pytest

from monarch_nb.actor import Actor, endpoint
from monarch_nb.wire import cuda, cuda_ipc, cuda_tensors, serialize
from monarch_nb.wire import frames as wire_frames
from monarch_nb.wire import port as wire_port

torch = pytest.importorskip("torch")  # noqa: E402 (procs import this module: torch is installed there too)

from conftest import cuda_gpu_count, wait_until  # noqa: E402
from cuda_fake import FakeCuda  # noqa: E402


LOCAL, REMOTE = "tcp://127.0.0.1:1", "tcp://198.51.100.7:1"  # a receiver of this host; of another (TEST-NET)


@pytest.fixture
def fake(monkeypatch):
    """A fake CUDA with 2 devices in this process; the once-per-process warning re-armed;
    ``MONARCH_NB_CUDA_IPC`` unset (the default)."""
    monkeypatch.setattr(cuda_tensors, "_warned", False)
    monkeypatch.delenv(cuda_ipc.ENV, raising=False)
    fake = FakeCuda(devices=2)
    old = cuda.use(fake)
    yield fake
    cuda.use(old)


def round_trip(value):
    stream, buffers = serialize.dumps(value)
    return serialize.loads(stream, [b.raw() for b in buffers]), stream, buffers


def test_a_cuda_tensor_travels_out_of_band_staged_in_pinned_memory(fake):
    sent = fake.tensor(torch.arange(1 << 16, dtype=torch.float32), 1)  # 256 KiB
    got, stream, buffers = round_trip(sent)
    assert len(buffers) == 1 and buffers[0].raw().nbytes == sent.nbytes and len(stream) < 1024
    assert ("to_host", True) in fake.calls
    assert fake.is_cuda(got) and fake.device_index(got) == 1  # the same index: the receiver has it
    assert torch.equal(got, sent) and got is not sent


def test_a_receiver_with_fewer_devices_rebuilds_on_cuda_0(fake):
    sent = fake.tensor(torch.ones(4), 1)
    stream, buffers = serialize.dumps(sent)
    fake.devices = 1  # the receiver: a proc bound to one GPU sees it as cuda:0
    got = serialize.loads(stream, [b.raw() for b in buffers])
    assert fake.device_index(got) == 0 and ("to_device", 0) in fake.calls


def test_dtype_shape_and_requires_grad_are_kept_and_strides_made_contiguous(fake):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    sent = fake.tensor(base.t().requires_grad_(True), 0)  # not contiguous
    got, _, _ = round_trip(sent)
    assert got.shape == (6, 4) and got.is_contiguous() and got.requires_grad and got.is_leaf
    assert torch.equal(got.detach(), sent.detach())
    for dtype in (torch.bfloat16, torch.float16, torch.int64, torch.bool):
        got, _, _ = round_trip(fake.tensor(torch.ones(3, 5, dtype=dtype), 0))
        assert got.dtype == dtype and got.shape == (3, 5) and fake.is_cuda(got)


def test_a_receiver_without_cuda_gets_cpu_tensors_and_one_warning(fake):
    sent = [fake.tensor(torch.full((8,), float(i)), 1) for i in range(3)]
    stream, buffers = serialize.dumps(sent)
    fake.devices = 0  # a notebook without a GPU
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = serialize.loads(stream, [b.raw() for b in buffers])
        again = serialize.loads(stream, [b.raw() for b in buffers])
    assert [t.tolist() for t in got] == [[float(i)] * 8 for i in range(3)]
    assert not any(fake.is_cuda(t) for t in got + again) and again[2][0] == 2.0
    assert [w.category for w in caught] == [cuda_tensors.CudaTensorOnCpuWarning]
    assert "cuda:1" in str(caught[0].message) and "without CUDA" in str(caught[0].message)


def test_cpu_tensors_never_take_the_cuda_path(fake):
    sent = torch.arange(1 << 16, dtype=torch.int32)
    got, _, buffers = round_trip(sent)
    assert fake.calls == [] and torch.equal(got, sent) and not fake.is_cuda(got)
    got[0] = 5  # over the received frame, as before: writable, no copy
    assert buffers[0].raw().cast("i")[0] == 5


def test_the_same_cuda_tensor_twice_in_a_message_is_staged_once(fake):
    t = fake.tensor(torch.ones(1 << 15), 0)
    (a, b), _, buffers = round_trip((t, t))
    assert len(buffers) == 1 and a is b and fake.calls.count(("to_host", True)) == 1


@pytest.fixture
def own_keeper(monkeypatch, fake):
    """This process's keeper for the test, releasing as soon as a claim ends (no linger)."""
    k = cuda_ipc.Keeper(linger_s=0, unclaimed_s=60)
    monkeypatch.setattr(cuda_ipc, "_keeper", k)
    yield k
    k.close()


@pytest.fixture
def keeper(monkeypatch, own_keeper):
    """Tensors always sent by CUDA IPC (MONARCH_NB_CUDA_IPC=1), whatever their receivers,
    kept by :func:`own_keeper`."""
    monkeypatch.setenv(cuda_ipc.ENV, "1")
    return own_keeper


def test_by_default_a_message_for_this_host_sends_cuda_tensors_by_ipc(fake, own_keeper):
    sent = fake.tensor(torch.ones(1 << 15), 0)
    stream, buffers = serialize.dumps(sent, destinations=[LOCAL, LOCAL.replace(":1", ":2")])
    assert buffers == [] and fake.calls == [] and own_keeper.kept() == 1  # a token, no staging
    assert torch.equal(serialize.loads(stream, []), sent)


def test_by_default_a_message_for_another_host_stages_its_cuda_tensors(fake, own_keeper):
    sent = fake.tensor(torch.ones(1 << 15), 0)
    for destinations in ([REMOTE], [LOCAL, REMOTE]):  # every receiver must be of this host
        _, buffers = serialize.dumps(sent, destinations=destinations)
        assert len(buffers) == 1 and own_keeper.kept() == 0
    assert fake.calls == [("to_host", True)] * 2


def test_a_message_without_known_receivers_stages_its_cuda_tensors(fake, own_keeper, monkeypatch):
    for value in (None, "auto"):
        if value is not None:
            monkeypatch.setenv(cuda_ipc.ENV, value)
        _, buffers = serialize.dumps(fake.tensor(torch.ones(1 << 15), 0))
        assert len(buffers) == 1 and own_keeper.kept() == 0


def test_cuda_ipc_0_stages_even_for_this_host(fake, own_keeper, monkeypatch):
    monkeypatch.setenv(cuda_ipc.ENV, "0")
    _, buffers = serialize.dumps(fake.tensor(torch.ones(1 << 15), 0), destinations=[LOCAL])
    assert len(buffers) == 1 and own_keeper.kept() == 0 and fake.calls == [("to_host", True)]


def test_a_bad_cuda_ipc_value_is_a_clear_error(fake, monkeypatch):
    monkeypatch.setenv(cuda_ipc.ENV, "yes")
    with pytest.raises(ValueError, match=r"MONARCH_NB_CUDA_IPC='yes' .*'auto'.*'1'.*'0'"):
        serialize.dumps(fake.tensor(torch.ones(4), 0), destinations=[LOCAL])


class _Outbox:
    """What an actor's replies were sent as (``wire.port.deliver``'s outbox)."""

    def __init__(self):
        self.sent: list = []

    def send(self, address, frames) -> None:
        self.sent.append((address, frames))


def test_a_cuda_reply_goes_by_ipc_straight_to_this_host_and_staged_through_a_router(fake, own_keeper):
    wire_frames.register_key("cuda-reply-test", b"c" * 64)
    outbox, sent = _Outbox(), fake.tensor(torch.ones(1 << 15), 0)
    wire_port.deliver(outbox, "cuda-reply-test", LOCAL, 7, 0, value=sent)  # to a client of this host
    # To this host's router, with the client's route as the port: the router may fold the
    # value or forward it to a client on another host, so it is staged.
    wire_port.deliver(outbox, "cuda-reply-test", LOCAL, (REMOTE, 7), 0, value=sent)
    (_, direct), (_, routed) = outbox.sent
    assert len(direct) <= wire_frames.FIXED_FRAMES < len(routed)  # a token; the tensor's bytes out of band
    assert own_keeper.kept() == 1 and fake.calls == [("to_host", True)]


def test_by_ipc_a_tensor_for_two_receivers_is_kept_until_both_copied(fake, own_keeper):
    sent = fake.tensor(torch.arange(64, dtype=torch.float32), 0)
    stream, _ = serialize.dumps(sent, destinations=[LOCAL, LOCAL.replace(":1", ":2")])
    first = serialize.loads(stream, [])
    assert wait_until(lambda: own_keeper.claims == 1 and own_keeper.claims_open() == 0, 5)
    assert own_keeper.kept() == 1  # no linger here: kept because the second receiver has not claimed it yet
    second = serialize.loads(stream, [])
    assert torch.equal(first, sent) and torch.equal(second, sent)
    assert wait_until(lambda: own_keeper.kept() == 0, 5)


def test_by_ipc_the_sender_keeps_the_tensor_until_the_receiver_copied_it(fake, keeper):
    sent = fake.tensor(torch.arange(1 << 16, dtype=torch.float32), 1)
    stream, buffers = serialize.dumps(sent)
    assert buffers == [] and fake.calls == []  # no staging: only a token travels
    alive = weakref.ref(sent)
    del sent  # the sender's own variable is gone; its keeper holds the tensor
    fake.may_copy.clear()
    received: list = []
    receiver = threading.Thread(target=lambda: received.append(serialize.loads(stream, [])))
    receiver.start()
    try:
        assert fake.opening.wait(10) and keeper.claims_open() == 1
        assert alive() is not None and keeper.kept() == 1  # mid-copy: kept
    finally:
        fake.may_copy.set()
        receiver.join(10)
    got = received[0]
    assert torch.equal(got, torch.arange(1 << 16, dtype=torch.float32)) and fake.is_cuda(got)
    assert wait_until(lambda: keeper.kept() == 0, 5) and alive() is None  # released after the copy
    assert [c[0] for c in fake.calls] == ["ipc_share", "ipc_open"] and (keeper.claims, keeper.staged) == (1, 0)


_DYING_RECEIVER = """
import sys, threading
sys.path.insert(0, {tests!r})
from cuda_fake import FakeCuda
from monarch_nb.wire import cuda, serialize
fake = FakeCuda(devices=1)
fake.may_copy.clear()  # the copy never ends: this process is killed during it
cuda.use(fake)
import torch
serialize.loads(sys.stdin.buffer.read(), [])
"""


def test_by_ipc_a_receiver_killed_during_its_copy_releases_the_tensor(fake, keeper):
    sent = fake.tensor(torch.ones(1024), 0)
    stream, _ = serialize.dumps(sent)
    alive = weakref.ref(sent)
    del sent
    code = _DYING_RECEIVER.format(tests=os.path.dirname(__file__))
    receiver = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    try:
        receiver.stdin.write(stream)
        receiver.stdin.close()
        assert wait_until(lambda: keeper.claims_open() == 1, 30), "the receiver never claimed the tensor"
        assert alive() is not None
        receiver.kill()
        assert wait_until(lambda: keeper.kept() == 0, 10) and alive() is None
    finally:
        receiver.kill()
        receiver.wait(10)


def test_by_ipc_a_receiver_that_cannot_open_it_gets_the_bytes_instead(fake, keeper):
    sent = fake.tensor(torch.arange(1000, dtype=torch.int64).reshape(10, 100).requires_grad_(False), 1)
    sent_bf16 = fake.tensor(torch.full((7,), 1.5, dtype=torch.bfloat16), 0)
    stream, _ = serialize.dumps((sent, sent_bf16))
    fake.ipc_opens = False  # another GPU, or a container without IPC
    got, got_bf16 = serialize.loads(stream, [])
    assert torch.equal(got, sent) and got.shape == (10, 100) and fake.device_index(got) == 1
    assert got_bf16.dtype == torch.bfloat16 and torch.equal(got_bf16, sent_bf16)
    assert ("to_host", True) in fake.calls and ("to_device", 1) in fake.calls  # the staged path's rules
    assert keeper.staged == 2
    assert wait_until(lambda: keeper.kept() == 0, 5)


def test_by_ipc_a_tensor_released_unclaimed_is_a_clear_error(fake, keeper):
    keeper.unclaimed_s = 0  # its message was lost, as far as the keeper can tell
    stream, _ = serialize.dumps(fake.tensor(torch.ones(8), 0))
    assert wait_until(lambda: keeper.kept() == 0, 5)
    with pytest.raises(cuda_ipc.CudaIpcUnavailable, match="released by its sender .* MONARCH_NB_CUDA_IPC=0"):
        serialize.loads(stream, [])


def test_the_cuda_paths_import_no_torch_until_a_tensor_is_sent():
    code = ("import sys; from monarch_nb.wire import serialize, cuda_ipc; "
            "serialize.loads(*serialize.dumps({'x': b'1' * 100000, 'y': [1.5]})); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


class FakeGpuActor(Actor):
    """An actor whose proc "has" ``devices`` CUDA devices (the fake, on a CPU machine)."""

    def __init__(self, devices: int):
        from cuda_fake import FakeCuda
        from monarch_nb.wire import cuda

        self.fake = FakeCuda(devices=devices)
        cuda.use(self.fake)

    @endpoint
    def make(self, n: int, index: int):
        import torch

        return self.fake.tensor(torch.arange(n, dtype=torch.float64), index)

    @endpoint
    def make_shared(self, n: int, index: int):
        """A tensor another process of this host can open by (fake) CUDA IPC."""
        import torch

        return self.fake.shared(torch.arange(n, dtype=torch.float64), index)

    @endpoint
    def where(self, tensor) -> tuple:
        return self.fake.is_cuda(tensor), self.fake.device_index(tensor), tensor.sum().item()

    @endpoint
    def opened(self) -> list:
        """The handles this proc opened by (fake) CUDA IPC."""
        return [call[1] for call in self.fake.calls if call[0] == "ipc_open"]

    @endpoint
    def keeper_counts(self) -> tuple:
        """This proc's CUDA IPC keeper: (claims served, of them answered with bytes, tensors kept now)."""
        from monarch_nb.wire import cuda_ipc

        keeper = cuda_ipc.keeper()
        return keeper.claims, keeper.staged, keeper.kept()


def test_an_actor_result_reaches_a_client_without_cuda_as_values(host, fake):
    fake.devices = 0
    procs = host.spawn_procs(per_host={"procs": 1}, name="cuda_fake_result")
    try:
        actor = procs.spawn("gpu", FakeGpuActor, 1)
        with pytest.warns(cuda_tensors.CudaTensorOnCpuWarning):
            got = actor.make.call_one(1 << 17, 0).get(timeout=60)  # 1 MiB: shared memory
        assert got.dtype == torch.float64 and torch.equal(got, torch.arange(1 << 17, dtype=torch.float64))
    finally:
        procs.stop()


def test_with_cuda_ipc_0_a_cuda_argument_is_staged_and_rebuilt_on_the_actors_own_device(host, fake,
                                                                                          monkeypatch):
    monkeypatch.setenv(cuda_ipc.ENV, "0")
    procs = host.spawn_procs(per_host={"procs": 1}, name="cuda_fake_arg")
    try:
        actor = procs.spawn("gpu", FakeGpuActor, 1)  # bound: one device, cuda:0
        sent = fake.tensor(torch.ones(1 << 17, dtype=torch.float64), 1)
        assert actor.where.call_one(sent).get(timeout=60) == (True, 0, float(1 << 17))
        assert fake.calls == [("to_host", True)]  # staged: no IPC share
        assert actor.opened.call_one().get(timeout=60) == []
    finally:
        procs.stop()


def test_by_default_a_cuda_argument_goes_to_an_actor_of_this_host_by_ipc(host, fake, monkeypatch):
    keeper = cuda_ipc.Keeper(linger_s=3600)  # released at once all the same: it knows its one receiver
    monkeypatch.setattr(cuda_ipc, "_keeper", keeper)
    procs = host.spawn_procs(per_host={"procs": 1}, name="cuda_fake_ipc_arg")
    try:
        actor = procs.spawn("gpu", FakeGpuActor, 1)  # bound: one device, cuda:0
        sent = fake.shared(torch.ones(1 << 17, dtype=torch.float64), 1)
        assert actor.where.call_one(sent).get(timeout=60) == (True, 0, float(1 << 17))
        assert [c[0] for c in fake.calls] == ["ipc_share"]  # no staging in the sender
        assert len(actor.opened.call_one().get(timeout=60)) == 1  # the actor opened the handle
        assert (keeper.claims, keeper.staged) == (1, 0)
        assert wait_until(lambda: keeper.kept() == 0, 30)
    finally:
        procs.stop()
        keeper.close()


def test_by_default_an_actors_cuda_result_comes_back_to_a_client_of_its_host_by_ipc(host, fake):
    procs = host.spawn_procs(per_host={"procs": 1}, name="cuda_fake_ipc_result")
    try:
        actor = procs.spawn("gpu", FakeGpuActor, 1)
        got = actor.make_shared.call_one(1 << 17, 0).get(timeout=60)
        assert torch.equal(got, torch.arange(1 << 17, dtype=torch.float64)) and fake.device_index(got) == 0
        assert [c[0] for c in fake.calls] == ["ipc_open", "ipc_map"]  # opened here, not staged
        claims, staged, _ = actor.keeper_counts.call_one().get(timeout=60)
        assert (claims, staged) == (1, 0)
        assert wait_until(lambda: actor.keeper_counts.call_one().get(timeout=60)[2] == 0, 30)
    finally:
        procs.stop()


# Real GPUs: skipped without one (the one allowed skip; run by bench/gpu_check.py).

@pytest.fixture(scope="module")
def gpu() -> int:
    count = cuda_gpu_count()
    if not count:
        pytest.skip("needs a CUDA GPU: torch.cuda.is_available() is False here")
    return count


class CudaEcho(Actor):
    @endpoint
    def add_one(self, tensor):
        return tensor.device.type, tensor.device.index, tensor + 1

    @endpoint
    def make(self, nbytes: int):
        import torch

        return torch.full((nbytes // 4,), 7.0, device="cuda")


def test_a_real_cuda_tensor_goes_staged_to_an_actor_and_back_on_the_gpu(gpu, host, monkeypatch):
    monkeypatch.setenv(cuda_ipc.ENV, "0")  # the path across hosts (the actor's reply goes by IPC: its default)
    procs = host.spawn_procs(per_host={"gpus": 1}, name="cuda_real")
    try:
        actor = procs.spawn("echo", CudaEcho)
        sent = torch.arange(1 << 20, dtype=torch.float32, device="cuda").reshape(1024, 1024).t()
        kind, index, back = actor.add_one.call_one(sent).get(timeout=120)
        assert (kind, index) == ("cuda", 0) and back.is_cuda and torch.equal(back, sent + 1)
        made = actor.make.call_one(64 << 20).get(timeout=120)
        assert made.is_cuda and made.shape == (16 << 20,) and bool((made == 7.0).all())
    finally:
        procs.stop()


def test_real_staging_uses_pinned_memory(gpu):
    host = cuda.ops().to_host(torch.ones(1024, device="cuda"), pinned=True)
    assert host.device.type == "cpu" and host.is_pinned() and host.sum().item() == 1024


def test_by_default_a_real_cuda_tensor_goes_by_ipc_to_an_actor_of_this_host(gpu, host, monkeypatch):
    monkeypatch.delenv(cuda_ipc.ENV, raising=False)
    procs = host.spawn_procs(per_host={"gpus": 1}, name="cuda_real_ipc")
    try:
        actor = procs.spawn("echo", CudaEcho)
        sent = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
        kind, index, back = actor.add_one.call_one(sent).get(timeout=120)
        assert (kind, index) == ("cuda", 0) and torch.equal(back, sent + 1)
        keeper = cuda_ipc.keeper()
        assert keeper.claims >= 1 and keeper.staged == 0  # opened by IPC, not sent as bytes
        assert wait_until(lambda: keeper.kept() == 0, cuda_ipc.LINGER_S + 5)
    finally:
        procs.stop()


def _hold_silent_connections(address: str, count: int) -> int:
    """(As another user) open ``count`` connections to a keeper and send nothing; how many
    the keeper closed unread within 10 s each."""
    import socket

    held = []
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(address)
        sock.settimeout(10)
        held.append(sock)
    closed = 0
    for sock in held:
        try:
            closed += sock.recv(1) == b""
        except OSError:  # still open after 10 s: held by a thread of the keeper's
            pass
        sock.close()
    return closed


def test_another_users_connections_to_the_keeper_are_closed_unread_and_cost_no_thread(own_keeper):
    # Its name is listed in /proc/net/unix; each silent connection of another user held
    # a thread of the owner's process for as long as it stayed open (500 -> 502 threads).
    from second_user import run_as_other_user

    threads = threading.active_count()
    assert run_as_other_user(_hold_silent_connections, own_keeper.address, 40) == 40
    assert own_keeper.refused == 40 and threading.active_count() <= threads
