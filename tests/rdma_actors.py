"""Actors for tests/test_rdma.py: they own RDMA buffers and read others'."""

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
