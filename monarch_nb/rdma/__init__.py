"""Monarch's RDMA API (``monarch.rdma``): one-sided reads and writes of another
process's memory, by handle.

``RDMABuffer(tensor_or_memoryview)`` registers 1-D contiguous memory of this process
and is a small picklable handle: send it in any message, and whoever holds it may
``read_into`` local memory from it or ``write_from`` local memory into it, without the
owner's endpoint code taking part.

Two backends, picked per transfer (:func:`get_rdma_backend` says which this host has):

- ``"shm"``: reader and owner on one host. The reader copies straight between the two
  address spaces with ``process_vm_readv``/``process_vm_writev`` (one copy, at memory
  speed; the owner does nothing). Linux allows it between processes of the same user
  (and under Yama's ptrace_scope 0); a probe at import decides.
- ``"tcp"``: otherwise. The owner's process serves its buffers from one IO thread of its
  own (never an actor's thread), over signed frames like every message. A transfer goes
  in chunks of ``TCP_CHUNK`` bytes, ``TCP_WINDOW`` of them in flight, so that one
  chunk's signing, checking and copying overlap the next ones' trips, and neither side
  holds more than the window in frames.

Liveness is checked on every transfer, before and after the copy: each registered
buffer has a random 64-bit token in the owner's memory that :meth:`RDMABuffer.drop`
clears, so a reader finds a dropped buffer (``RuntimeError``) instead of reading
freed memory, and a transfer the owner dropped midway fails rather than returning torn
data. An owner that is gone gives :class:`~monarch_nb.errors.SupervisionError`.

CUDA tensors are not supported yet (``NotImplementedError``); everything here runs
without torch.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import socket
import sys
import threading
import time
from typing import Any

import psutil

from .client.future import Future
from .client.runtime import runtime
from .errors import SupervisionError
from .protocol import envelope, rdma_ops
from .wire import fill
from .wire import frames as wire_frames
from .wire import sockets
from .wire.mailbox import Gather
from .wire.port import deliver
from .wire.remote_error import unpack_exception

__all__ = ["RDMAAction", "RDMABuffer", "RDMAReadTransferWarning", "RDMATcpFallbackWarning",
           "RDMAWriteTransferWarning", "get_rdma_backend", "is_ibverbs_available", "is_rdma_available"]

_CHUNK = 64 << 20  # bytes per system call: a timeout is checked between chunks
# Bytes per request of a "tcp" transfer, and requests of one transfer in flight at once.
# Under wire.stream.MIN_BYTES, so that each answer is one message (the window overlaps
# them already); between two network namespaces of the 2-core VM here, 64 MiB: 2 MiB x 8
# 0.88x a raw zmq stream, 2 MiB x 16 0.86x, 16 MiB x 4 0.70x.
TCP_CHUNK = 2 << 20
TCP_WINDOW = 8


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


_BOOT = _boot_id()


def _vm_copy(pid: int, local: int, remote: int, nbytes: int, write: bool, deadline: float) -> None:
    """Copy ``nbytes`` between ``local`` (this process) and ``remote`` (``pid``'s)
    addresses, in chunks; raises ``OSError`` from the kernel, ``TimeoutError`` past
    ``deadline`` (monotonic seconds)."""
    call = _libc.process_vm_writev if write else _libc.process_vm_readv
    done = 0
    while done < nbytes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"RDMA transfer cancelled after {done} of {nbytes} bytes: timed out")
        n = min(_CHUNK, nbytes - done)
        here, there = _IOVec(local + done, n), _IOVec(remote + done, n)
        moved = call(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0)
        if moved <= 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        done += moved


def _probe() -> str:
    cell = ctypes.c_uint64(1)
    out = ctypes.c_uint64(0)
    try:
        _vm_copy(os.getpid(), ctypes.addressof(out), ctypes.addressof(cell), 8, False, time.monotonic() + 5)
    except (OSError, AttributeError):
        return "tcp"
    return "shm" if out.value == 1 else "tcp"


_BACKEND = _probe()


def get_rdma_backend() -> str:
    """``"shm"`` when processes of this host can read each other's buffers directly,
    else ``"tcp"`` (always available)."""
    return _BACKEND


def is_rdma_available() -> bool:
    """Always True: a backend is always available (``"tcp"`` at worst)."""
    return True


def is_ibverbs_available() -> bool:
    """Always False: monarch_nb moves buffers with process_vm_readv/writev on one host
    and over TCP across hosts, never through ibverbs (InfiniBand/EFA) hardware. Monarch's
    code that picks a backend by this answer takes its non-ibverbs path."""
    return False


# Monarch's warning categories, for code that filters or expects them. monarch_nb emits
# none of them: its TCP path is a backend of its own, not a fallback from ibverbs.
class RDMAReadTransferWarning(Warning):
    """Monarch's: a read went over a slower path than RDMA (never emitted here)."""


class RDMAWriteTransferWarning(Warning):
    """Monarch's: a write went over a slower path than RDMA (never emitted here)."""


class RDMATcpFallbackWarning(Warning):
    """Monarch's: no ibverbs hardware, buffers fall back to TCP (never emitted here)."""


def _local_memory(obj: Any, writable: bool) -> tuple[int, int, Any]:
    """``(address, nbytes, keepalive)`` of a 1-D contiguous tensor or memoryview.

    Raises ``ValueError`` otherwise (or when ``writable`` is asked of read-only memory)."""
    torch = sys.modules.get("torch")  # never imported here: a tensor means the caller has it
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu":
            raise NotImplementedError("monarch_nb.rdma supports CPU tensors only; copy it to the CPU first")
        if obj.dim() != 1 or not obj.is_contiguous():
            raise ValueError(f"RDMA memory must be a 1-D contiguous tensor, got shape {tuple(obj.shape)}; "
                             "use t.contiguous().view(-1)")
        return obj.data_ptr(), obj.numel() * obj.element_size(), obj
    if isinstance(obj, memoryview):
        if obj.ndim != 1 or not obj.c_contiguous:
            raise ValueError(f"RDMA memory must be a 1-D C-contiguous memoryview, got shape {obj.shape}")
        if obj.nbytes == 0:
            return 0, 0, obj
        try:
            return ctypes.addressof(ctypes.c_char.from_buffer(obj)), obj.nbytes, obj
        except TypeError:  # read-only
            if writable:
                raise ValueError("RDMA destination is read-only; pass a writable memoryview") from None
            import numpy as np

            array = np.frombuffer(obj, np.uint8)
            return array.ctypes.data, obj.nbytes, (obj, array)
    raise ValueError(f"RDMA memory must be a torch.Tensor or memoryview, got {type(obj).__name__}")


# the owner's side -------------------------------------------------------------------

class _Registry:
    """This process's registered buffers, and the IO thread that serves them over TCP."""

    def __init__(self):
        self.lock = threading.Lock()
        self.buffers: dict[int, tuple[int, int, Any, ctypes.c_uint64]] = {}  # token -> (addr, size, keep, cell)
        self.address: str | None = None
        self.cluster: str | None = None
        self.pid = os.getpid()

    def add(self, addr: int, size: int, keep: Any) -> tuple[int, int]:
        token = secrets.randbits(63) | 1
        cell = ctypes.c_uint64(token)
        with self.lock:
            if self.address is None:
                self._start_server()
            self.buffers[token] = (addr, size, keep, cell)
        return token, ctypes.addressof(cell)

    def drop(self, token: int) -> None:
        with self.lock:
            entry = self.buffers.pop(token, None)
        if entry is not None:
            entry[3].value = 0  # readers see it dropped from now on

    def _start_server(self) -> None:
        clusters = wire_frames.trusted_clusters()
        if not clusters:
            raise RuntimeError("an RDMABuffer needs a cluster: create it in an actor, or after this_host() "
                               "or monarch_nb.connect()")
        self.cluster = clusters[0]
        inbox, self.address = sockets.bind_inbox()
        threading.Thread(target=self._serve, args=(inbox,), name="monarch-nb-rdma", daemon=True).start()

    def _serve(self, inbox) -> None:
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
                with self.lock:
                    entry = self.buffers.get(header[rdma_ops.TOKEN])
                if entry is None:
                    raise RuntimeError("the RDMABuffer was dropped by its owner")
                addr, size, _, _ = entry
                offset = header.get(rdma_ops.OFFSET, 0)
                length = header.get(rdma_ops.LENGTH, size - offset)
                if not (isinstance(offset, int) and isinstance(length, int)
                        and 0 <= offset and 0 <= length and offset + length <= size):
                    raise ValueError(f"range {offset}+{length} is outside the {size}-byte RDMABuffer")
                if header[envelope.OP] == rdma_ops.READ:
                    value = memoryview((ctypes.c_char * length).from_address(addr + offset)).cast("B")
                else:
                    data = memoryview(message.value()).cast("B")
                    ctypes.memmove(addr + offset, _local_memory(data, False)[0], min(length, data.nbytes))
            except Exception as e:  # noqa: BLE001 - every failure goes back to the reader
                error = e
            try:
                deliver(outbox, self.cluster, header[envelope.REPLY], header[envelope.PORT], None, value, error)
            except Exception:  # noqa: BLE001 - a reader gone mid-reply: it times out; serve the next
                pass


_registry = _Registry()


def _after_fork() -> None:
    global _registry
    _registry = _Registry()  # a forked child owns none of its parent's buffers


os.register_at_fork(after_in_child=_after_fork)


class RDMABuffer:
    """A handle on 1-D contiguous memory of the process that made it (see the module
    docstring). Picklable; :meth:`read_into`/:meth:`write_from` work from any process
    of the cluster, :meth:`drop` in the owner releases it."""

    def __init__(self, data: Any):
        addr, size, keep = _local_memory(data, writable=False)
        if size == 0:
            raise ValueError("Cannot create RDMABuffer with size 0.")
        self._size, self._addr = size, addr
        self._token, self._token_addr = _registry.add(addr, size, keep)
        self._pid, self._boot = os.getpid(), _BOOT
        self._started = psutil.Process().create_time()
        self._server, self._cluster = _registry.address, _registry.cluster

    def __repr__(self) -> str:
        return f"<RDMABuffer {self._size} bytes of pid {self._pid}>"

    @property
    def backend(self) -> str:
        """The backend a transfer from this process uses: ``"shm"`` or ``"tcp"``."""
        return "shm" if self._same_host() else "tcp"

    @property
    def owner(self) -> str:
        return f"pid {self._pid} at {self._server}"

    def size(self) -> int:
        """Size in bytes."""
        return self._size

    def read_into(self, dst: Any, *, timeout: int = 60) -> Future[None]:
        """Copy this buffer into ``dst`` (1-D contiguous tensor or writable memoryview of
        at least :meth:`size` bytes; ``ValueError`` otherwise, at once). The future fails
        with ``TimeoutError`` after ``timeout`` seconds (the transfer cancelled),
        ``SupervisionError`` if the owner is gone, ``RuntimeError`` if it dropped the buffer."""
        return RDMAAction().read_remote(dst, self).submit(timeout=timeout)

    def write_from(self, src: Any, *, timeout: int = 60) -> Future[None]:
        """Copy ``src`` (1-D contiguous, at most :meth:`size` bytes; ``ValueError``
        otherwise) into this buffer; fails like :meth:`read_into`."""
        return RDMAAction().write_remote(self, src).submit(timeout=timeout)

    def drop(self) -> Future[None]:
        """Release the memory: later transfers fail. A no-op outside the owner process."""
        if os.getpid() == self._pid and _registry.pid == self._pid:
            _registry.drop(self._token)
        return Future.finished(runtime(), "RDMABuffer.drop")

    # the reader's side ----------------------------------------------------------------
    def _same_host(self) -> bool:
        return _BACKEND == "shm" and self._boot == _BOOT

    def _check_owner(self) -> None:
        try:
            alive = psutil.Process(self._pid).create_time() == self._started
        except psutil.NoSuchProcess:
            alive = False
        if not alive:
            raise SupervisionError(f"the owner of {self!r} is gone")

    def _check_token(self, deadline: float) -> None:
        seen = ctypes.c_uint64(0)
        try:
            _vm_copy(self._pid, ctypes.addressof(seen), self._token_addr, 8, False, deadline)
        except TimeoutError:  # an OSError too, but no news about the owner
            raise
        except OSError as e:
            if e.errno == errno.ESRCH:
                raise SupervisionError(f"the owner of {self!r} is gone") from None
        if seen.value != self._token:
            raise RuntimeError(f"{self!r} was dropped by its owner")

    def _transfer(self, local: int, nbytes: int, write: bool, deadline: float) -> None:
        self._check_owner()
        if self._same_host():
            self._check_token(deadline)
            try:
                _vm_copy(self._pid, local, self._addr, nbytes, write, deadline)
            except OSError:
                self._check_owner()
                raise
            self._check_token(deadline)  # dropped midway: what was copied may be torn
        else:
            self._over_tcp(local, nbytes, write, deadline)

    def _over_tcp(self, local: int, nbytes: int, write: bool, deadline: float) -> None:
        """Move ``nbytes`` in chunks of ``TCP_CHUNK``, ``TCP_WINDOW`` requests in flight;
        each answer names its chunk (as its port), and a read's is copied to its place
        as it lands."""
        inbox, address = sockets.bind_inbox()
        outbox, guard = sockets.Outbox(), wire_frames.ReplayGuard()
        ranges = [(start, min(TCP_CHUNK, nbytes - start)) for start in range(0, nbytes, TCP_CHUNK)]
        op = rdma_ops.WRITE if write else rdma_ops.READ
        try:
            sent, answered = 0, set[int]()
            while len(answered) < len(ranges):
                while sent < len(ranges) and sent - len(answered) < TCP_WINDOW:
                    start, length = ranges[sent]
                    header = {envelope.OP: op, rdma_ops.TOKEN: self._token, rdma_ops.OFFSET: start,
                              rdma_ops.LENGTH: length, envelope.REPLY: address, envelope.PORT: sent}
                    data = memoryview((ctypes.c_char * length).from_address(local + start)).cast("B") \
                        if write else None
                    if not write:  # its pages faulted in at once while the answer travels
                        fill.prefault_at(local + start, length)
                    outbox.send(self._server, wire_frames.encode_value(self._cluster, header, data))
                    sent += 1
                while not inbox.poll(int(max(0.0, min(deadline - time.monotonic(), 0.5)) * 1000)):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"RDMA transfer with {self!r} timed out after {len(answered)} of "
                                           f"{len(ranges)} chunks; cancelled")
                    self._check_owner()
                try:
                    message = wire_frames.decode(sockets.recv_frames(inbox), guard)
                except wire_frames.BadMessage:
                    continue  # counted; never acted on
                value = message.value()
                if not message.header[envelope.OK]:
                    raise unpack_exception(value)[0]
                chunk = message.header[envelope.PORT]
                if chunk in answered or not 0 <= chunk < sent:
                    continue
                if not write:
                    start, length = ranges[chunk]
                    ctypes.memmove(local + start, _local_memory(memoryview(value).cast("B"), False)[0], length)
                answered.add(chunk)
        finally:
            outbox.close_thread_sockets()
            inbox.close(0)


class RDMAAction:
    """A batch of reads and writes, submitted as one unit (Monarch's ``RDMAAction``)."""

    def __init__(self):
        self._ops: list[tuple[RDMABuffer, int, int, bool, Any]] = []

    def read_remote(self, dst: Any, src: RDMABuffer) -> "RDMAAction":
        """Queue a read of ``src`` into ``dst``; ``ValueError`` if ``dst`` is smaller than ``src``."""
        addr, size, keep = _local_memory(dst, writable=True)
        if size < src.size():
            raise ValueError(f"destination of {size} bytes is smaller than the {src.size()}-byte RDMABuffer")
        self._ops.append((src, addr, src.size(), False, keep))
        return self

    def write_remote(self, dst: RDMABuffer, src: Any) -> "RDMAAction":
        """Queue a write of ``src`` into ``dst``; ``ValueError`` if ``src`` is larger than ``dst``."""
        addr, size, keep = _local_memory(src, writable=False)
        if size > dst.size():
            raise ValueError(f"source of {size} bytes is larger than the {dst.size()}-byte RDMABuffer")
        self._ops.append((dst, addr, size, True, keep))
        return self

    def fetch_add(self, src: RDMABuffer, dst: Any, add: int) -> "RDMAAction":
        raise NotImplementedError("Not yet supported")

    def compare_and_swap(self, src: RDMABuffer, dst: Any, compare: int, swap: int) -> "RDMAAction":
        raise NotImplementedError("Not yet supported")

    def submit(self, *, timeout: int = 60) -> Future[None]:
        """Run the queued ops, in order, on a thread of this process; the future resolves
        when all are done, or fails with the first error (``TimeoutError`` past
        ``timeout`` seconds for the whole batch, the rest cancelled)."""
        rt = runtime()
        future: Future = Future(rt, "RDMA transfer")
        ops = list(self._ops)
        deadline = time.monotonic() + timeout

        def on_reply(_key, message: wire_frames.Message) -> None:
            gather.close()
            value = message.value()
            future._resolve(None, None if message.header[envelope.OK] else unpack_exception(value)[0])

        # The worker answers on a port of this process's mailbox: a future waited on
        # with get() wakes the moment the answer lands, like any call's.
        gather = Gather(rt.mailbox, on_reply)
        route = gather.open()
        cluster = wire_frames.trusted_clusters()[0] if wire_frames.trusted_clusters() else None

        def run() -> None:
            error = None
            try:
                for buffer, addr, nbytes, write, _keep in ops:
                    buffer._transfer(addr, nbytes, write, deadline)
            except BaseException as e:  # noqa: BLE001 - reported through the future
                error = e
            if cluster is None:
                future._resolve(None, error)
                return
            deliver(_worker_outbox, cluster, route[envelope.REPLY], route[envelope.PORT], None, None, error)
            _worker_outbox.close_thread_sockets()  # this thread ends: no socket left behind

        threading.Thread(target=run, name="monarch-nb-rdma-op", daemon=True).start()
        return future


_worker_outbox = sockets.Outbox()
