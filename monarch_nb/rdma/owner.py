"""The owner's side of ``monarch_nb.rdma``: this process's registered buffers, their
liveness tokens, and the IO thread that serves them to readers that can't copy them
one-sided (the ``"tcp"`` backend; CUDA memory without CUDA IPC)."""

from __future__ import annotations

import ctypes
import functools
import os
import secrets
import threading

from ..proc.actor import at_actor_end, current_actor_id
from ..protocol import envelope, rdma_ops
from ..wire import cuda
from ..wire import frames as wire_frames
from ..wire import sockets
from ..wire.port import deliver
from .memory import Local


class _Dropped(RuntimeError):
    """A request for a buffer that is not registered (any more)."""


class Registry:
    """This process's registered buffers, and the IO thread that serves them over TCP."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # token -> (memory, liveness cell, the actor that owns it or None)
        self.buffers: dict[int, tuple[Local, ctypes.c_uint64, str | None]] = {}
        self._owned: dict[str, set[int]] = {}  # actor id -> the tokens of the live buffers it registered
        self.address: str | None = None
        self.cluster: str | None = None
        self.pid = os.getpid()
        self._staging: memoryview | None = None  # host memory a CUDA buffer's chunks are read through

    def add(self, memory: Local) -> tuple[int, int, str | None]:
        """Register ``memory``; returns its token, the address of its liveness cell
        (which holds the token until :meth:`drop`, then 0) and the actor that owns it:
        the one whose call runs now, ``None`` in a client. An actor's buffers are
        dropped when it ends (Monarch's buffers belong to an actor): a notebook that
        stops a mesh and spawns another for days must not pile up the memory of every
        buffer the stopped actors never dropped."""
        token = secrets.randbits(63) | 1
        cell = ctypes.c_uint64(token)
        owner, first = current_actor_id(), False
        with self.lock:
            if self.address is None:
                self._start_server()
            self.buffers[token] = (memory, cell, owner)
            if owner is not None:
                first = owner not in self._owned
                self._owned.setdefault(owner, set()).add(token)
        if owner is not None and first:
            at_actor_end(functools.partial(self.drop_all_of, owner))
        return token, ctypes.addressof(cell), owner

    def drop(self, token: int) -> None:
        with self.lock:
            entry = self.buffers.pop(token, None)
            if entry is not None and entry[2] is not None:
                self._owned.get(entry[2], set()).discard(token)
        if entry is not None:
            entry[1].value = 0  # readers see it dropped from now on

    def drop_all_of(self, owner: str) -> None:
        """Drop every buffer actor ``owner`` registered and did not drop (it ended)."""
        with self.lock:
            entries = self._take(self._owned.pop(owner, set()))
        for _, cell, _ in entries:
            cell.value = 0

    def _take(self, tokens: set[int]) -> list:
        """Unregister ``tokens``' buffers; their entries. The caller holds ``lock`` (a loop
        of its own, outside the ``with``: see monarch_nb.wire.interrupts)."""
        return [self.buffers.pop(token) for token in tokens if token in self.buffers]

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
            value, error, extra = None, None, None
            try:
                value = self._answer(message)
            except Exception as e:  # noqa: BLE001 - every failure goes back to the reader
                error = e
                if isinstance(e, _Dropped):
                    extra = {rdma_ops.DROPPED: True}
            try:
                # A send returns once the value's bytes left this process, so the next
                # request may reuse the staging memory they were read into.
                deliver(outbox, cluster, header[envelope.REPLY], header[envelope.PORT], None, value, error,
                        extra=extra)
            except Exception:  # noqa: BLE001 - a reader gone mid-reply: it times out; serve the next
                pass

    def _answer(self, message: wire_frames.Message) -> memoryview | None:
        """What a read or write request is answered with: the range's bytes, or None."""
        header = message.header
        with self.lock:
            entry = self.buffers.get(header[rdma_ops.TOKEN])
        if entry is None:
            raise _Dropped("the RDMABuffer was dropped by its owner")
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
