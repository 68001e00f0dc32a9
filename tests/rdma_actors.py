"""Actors for tests/test_rdma.py and tests/test_cuda_rdma.py: they own RDMA buffers and read others'."""

from __future__ import annotations

import os

from monarch_nb.actor import Actor, endpoint
from monarch_nb.rdma import RDMABuffer


class Holder(Actor):
    def __init__(self):
        self.data = bytearray(range(256)) * 4096  # 1 MiB
        self.buffer = None

    @endpoint
    def create(self) -> RDMABuffer:
        self.data[:] = bytearray(range(256)) * 4096  # as new: earlier tests wrote into it
        self.buffer = RDMABuffer(memoryview(self.data))
        return self.buffer

    @endpoint
    def contents(self) -> bytes:
        return bytes(self.data)

    @endpoint
    def drop(self) -> None:
        self.buffer.drop().get()

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def read(self, buffer: RDMABuffer) -> bytes:
        dst = bytearray(buffer.size())
        buffer.read_into(memoryview(dst)).get()
        return bytes(dst)


class Registered(Actor):
    """Reports the RDMA buffers its proc holds registered (whoever made them)."""

    @endpoint
    def count(self) -> int:
        from monarch_nb import rdma

        return len(rdma._registry.buffers)


class FakeGpuHolder(Holder):
    """Owns a 1 MiB RDMABuffer of (fake) CUDA memory, in a proc whose CUDA is
    tests/cuda_fake.py: the buffer's calls to CUDA are counted there."""

    def __init__(self):
        from cuda_fake import FakeCuda
        from monarch_nb.wire import cuda

        self.fake = FakeCuda(devices=1)
        cuda.use(self.fake)
        self.tensor = self.buffer = None

    @endpoint
    def create(self, shareable: bool = True) -> RDMABuffer:
        """A new buffer over bytes 0..255 repeated; ``shareable=False``: one CUDA IPC
        can't share (readers go through this proc, staged)."""
        import torch

        pattern = torch.arange(256, dtype=torch.uint8).repeat(4096)
        self.tensor = self.fake.shared(pattern)
        self.fake.ipc_shares = shareable
        try:
            self.buffer = RDMABuffer(self.tensor)
        finally:
            self.fake.ipc_shares = True
        return self.buffer

    @endpoint
    def contents(self) -> bytes:
        return bytes(self.tensor.numpy())

    @endpoint
    def calls(self) -> list:
        """This proc's CUDA calls since the last ``calls()`` (cleared)."""
        calls, self.fake.calls[:] = list(self.fake.calls), []
        return calls

    @endpoint
    def read(self, buffer: RDMABuffer) -> bytes:
        """Read ``buffer`` into (fake) CUDA memory of this proc; its bytes."""
        import torch

        dst = self.fake.tensor(torch.zeros(buffer.size(), dtype=torch.uint8))
        buffer.read_into(dst).get()
        return bytes(dst.numpy())


class CudaHolder(Actor):
    """Owns an RDMABuffer over a real CUDA tensor (GPU tests)."""

    @endpoint
    def create(self, n: int) -> RDMABuffer:
        import torch

        self.tensor = torch.arange(n, dtype=torch.float32, device="cuda")
        torch.cuda.synchronize()  # the data is there before a reader copies it
        self.buffer = RDMABuffer(self.tensor)
        return self.buffer

    @endpoint
    def head(self, n: int) -> list:
        return self.tensor[:n].tolist()
