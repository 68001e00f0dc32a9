"""The owner's side of ``monarch_nb.rdma``: this process's registered buffers, their
liveness tokens, and the IO thread that serves them to readers that can't copy them
one-sided (the ``"tcp"`` backend; CUDA memory without CUDA IPC)."""

from __future__ import annotations

import ctypes
import os
import secrets
import threading

from ..protocol import envelope, rdma_ops
from ..wire import cuda
from ..wire import frames as wire_frames
from ..wire import sockets
from ..wire.port import deliver
from .memory import Local


class Registry:
    """This process's registered buffers, and the IO thread that serves them over TCP."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buffers: dict[int, tuple[Local, ctypes.c_uint64]] = {}  # token -> (memory, liveness cell)
        self.address: str | None = None
        self.cluster: str | None = None
        self.pid = os.getpid()
        self._staging: memoryview | None = None  # host memory a CUDA buffer's chunks are read through

    def add(self, memory: Local) -> tuple[int, int]:
        """Register ``memory``; returns its token and the address of its liveness cell
        (which holds the token until :meth:`drop`, then 0)."""
        token = secrets.randbits(63) | 1
        cell = ctypes.c_uint64(token)
        with self.lock:
            if self.address is None:
                self._start_server()
            self.buffers[token] = (memory, cell)
        return token, ctypes.addressof(cell)

    def drop(self, token: int) -> None:
        with self.lock:
            entry = self.buffers.pop(token, None)
        if entry is not None:
            entry[1].value = 0  # readers see it dropped from now on

    def _start_server(self) -> None:
        clusters = wire_frames.trusted_clusters()
        if not clusters:
            raise RuntimeError("an RDMABuffer needs a cluster: create it in an actor, or after this_host() "
                               "or monarch_nb.connect()")
        self.cluster = clusters[0]
        inbox, self.address = sockets.bind_inbox()
        threading.Thread(target=self._serve, args=(inbox, self.cluster), name="monarch-nb-rdma", daemon=True).start()

    def _serve(self, inbox, cluster: str) -> None:
        guard, outbox = wire_frames.ReplayGuard(), sockets.Outbox()
        while True:
            try:
                message = wire_frames.decode(sockets.recv_frames(inbox), guard)
            except wire_frames.BadMessage:
                continue
            header = message.header
            if envelope.REPLY not in header or envelope.PORT not in header:
                wire_frames.count_dropped()  # signed, but nobody to answer: this thread serves on
                continue
            value, error = None, None
            try:
                value = self._answer(message)
            except Exception as e:  # noqa: BLE001 - every failure goes back to the reader
                error = e
            try:
                # A send returns once the value's bytes left this process, so the next
                # request may reuse the staging memory they were read into.
                deliver(outbox, cluster, header[envelope.REPLY], header[envelope.PORT], None, value, error)
            except Exception:  # noqa: BLE001 - a reader gone mid-reply: it times out; serve the next
                pass

    def _answer(self, message: wire_frames.Message) -> memoryview | None:
        """What a read or write request is answered with: the range's bytes, or None."""
        header = message.header
        with self.lock:
            entry = self.buffers.get(header[rdma_ops.TOKEN])
        if entry is None:
            raise RuntimeError("the RDMABuffer was dropped by its owner")
        memory = entry[0]
        size = memory.nbytes
        offset = header.get(rdma_ops.OFFSET, 0)
        length = header.get(rdma_ops.LENGTH, size - offset)
        if not (isinstance(offset, int) and isinstance(length, int)
                and 0 <= offset and 0 <= length and offset + length <= size):
            raise ValueError(f"range {offset}+{length} is outside the {size}-byte RDMABuffer")
        if header[envelope.OP] == rdma_ops.READ:
            return memory.get(offset, length, self._staging_of(length) if memory.device is not None else None)
        if memory.readonly:  # (RDMAAction refuses it first: a reader's handle says so)
            raise ValueError("the RDMABuffer is over read-only memory: it can be read, not written")
        data = memoryview(message.value()).cast("B")
        memory.put(offset, data[:min(length, data.nbytes)])
        return None

    def _staging_of(self, nbytes: int) -> memoryview:
        """Staging memory (pinned when it can be) of at least ``nbytes``, kept for the next chunks."""
        if self._staging is None or self._staging.nbytes < nbytes:
            self._staging = cuda.ops().pinned_buffer(nbytes)
        return self._staging
