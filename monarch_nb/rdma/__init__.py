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

CUDA tensors (``monarch_nb.rdma.device``): a buffer over a CUDA tensor is read and
written by CUDA IPC from processes of its host (``"cuda_ipc"``: the owner exports an IPC
handle once, in the constructor; a reader maps it at its first transfer and copies
device to device, or device to host, with no owner code running); from another host, or
where IPC is off (``MONARCH_NB_RDMA_CUDA_IPC=0``) or the handle won't open, through the
owner's IO thread, which stages each ``TCP_CHUNK`` through pinned host memory. A CUDA
tensor may also be the local side of any transfer: it is staged through pinned memory
in chunks. Every CUDA call goes through ``wire.cuda.ops()``.

Liveness is checked on every transfer, before and after the copy: each registered
buffer has a random 64-bit token in the owner's memory that :meth:`RDMABuffer.drop`
clears, so a reader finds a dropped buffer (``RuntimeError``) instead of reading
freed memory, and a transfer the owner dropped midway fails rather than returning torn
data. A buffer belongs to the actor whose call made it (as in Monarch) and is dropped
when that actor ends (stopped, or its mesh or proc stopped), releasing its memory; one
made in a client lives until dropped. An owner process that is gone gives
:class:`~monarch_nb.errors.SupervisionError`.
Nothing here imports torch.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import threading
import time
from typing import Any

import psutil

from ..client.future import Future
from ..client.runtime import runtime
from ..errors import SupervisionError
from ..protocol import envelope, rdma_ops
from ..wire import cuda, fill
from ..wire import frames as wire_frames
from ..wire import sockets
from ..wire.mailbox import Gather
from ..wire.port import deliver
from ..wire.remote_error import unpack_exception
from . import device, vm
from .memory import Local, local_memory
from .owner import Registry

__all__ = ["RDMAAction", "RDMABuffer", "RDMAReadTransferWarning", "RDMATcpFallbackWarning",
           "RDMAWriteTransferWarning", "get_rdma_backend", "is_ibverbs_available", "is_rdma_available"]

# Bytes per request of a "tcp" transfer, and requests of one transfer in flight at once.
# Under wire.stream.MIN_BYTES, so that each answer is one message (the window overlaps
# them already); between two network namespaces of the 2-core VM here, 64 MiB: 2 MiB x 8
# 0.88x a raw zmq stream, 2 MiB x 16 0.86x, 16 MiB x 4 0.70x.
TCP_CHUNK = 2 << 20
TCP_WINDOW = 8


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


_BOOT = _boot_id()
_BACKEND = vm.probe()


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


_registry = Registry()  # this process's buffers (as an owner)
_mappings = device.Mappings()  # this process's CUDA IPC mappings of owners' buffers (as a reader)


def _after_fork() -> None:
    global _registry, _mappings
    _registry = Registry()  # a forked child owns none of its parent's buffers
    _mappings = device.Mappings()  # nor its CUDA mappings (CUDA does not survive a fork)


os.register_at_fork(after_in_child=_after_fork)


def _dropped(buffer: "RDMABuffer") -> str:
    if buffer._actor is None:
        return f"{buffer!r} was dropped by its owner"
    return (f"{buffer!r} was dropped by its owner, actor {buffer._actor} (by drop(), or as it ended: an actor's "
            "buffers end with it)")


class RDMABuffer:
    """A handle on 1-D contiguous memory of the process that made it, host memory or a
    CUDA tensor (see the module docstring). Picklable; :meth:`read_into`/:meth:`write_from`
    work from any process of the cluster, :meth:`drop` in the owner releases it."""

    def __init__(self, data: Any):
        """``data``: a 1-D contiguous tensor (CPU or CUDA) or memoryview; ``ValueError``
        otherwise or when empty. A CUDA tensor's IPC handle is exported here, once."""
        memory = local_memory(data, writable=False)
        if memory.nbytes == 0:
            raise ValueError("Cannot create RDMABuffer with size 0.")
        self._size, self._addr = memory.nbytes, memory.addr  # addr: 0 for CUDA memory
        self._cuda = memory.device is not None
        self._readonly = memory.readonly  # a read-only memoryview's (bytes): write_from refuses it
        self._ipc = device.export(memory.device) if self._cuda else None
        self._token, self._token_addr, self._actor = _registry.add(memory)
        self._pid, self._boot = os.getpid(), _BOOT
        self._started = psutil.Process().create_time()
        self._server, self._cluster = _registry.address, _registry.cluster

    def __repr__(self) -> str:
        return f"<RDMABuffer {self._size} bytes of {'CUDA' if self._cuda else 'host'} memory of pid {self._pid}>"

    @property
    def backend(self) -> str:
        """The backend a transfer from this process uses: ``"shm"`` or ``"tcp"`` for host
        memory, ``"cuda_ipc"`` or ``"tcp"`` (staged by the owner) for CUDA memory.
        ``"cuda_ipc"`` falls back to ``"tcp"`` when the handle does not open here."""
        if self._cuda:
            return "cuda_ipc" if self._by_ipc_here() else "tcp"
        return "shm" if self._same_host() else "tcp"

    @property
    def owner(self) -> str:
        return f"pid {self._pid} at {self._server}"

    def size(self) -> int:
        """Size in bytes."""
        return self._size

    def read_into(self, dst: Any, *, timeout: int = 60) -> Future[None]:
        """Copy this buffer into ``dst`` (1-D contiguous tensor, CPU or CUDA, or writable
        memoryview, of at least :meth:`size` bytes; ``ValueError`` otherwise, at once).
        The future fails with ``TimeoutError`` after ``timeout`` seconds (the transfer
        cancelled), ``SupervisionError`` if the owner is gone, ``RuntimeError`` if it
        dropped the buffer."""
        return RDMAAction().read_remote(dst, self).submit(timeout=timeout)

    def write_from(self, src: Any, *, timeout: int = 60) -> Future[None]:
        """Copy ``src`` (1-D contiguous tensor, CPU or CUDA, or memoryview, at most
        :meth:`size` bytes; ``ValueError`` otherwise) into this buffer; fails like
        :meth:`read_into`."""
        return RDMAAction().write_remote(self, src).submit(timeout=timeout)

    def drop(self) -> Future[None]:
        """Release the memory: later transfers fail. A no-op outside the owner process.
        An actor's buffers are released when it ends, dropped or not."""
        if os.getpid() == self._pid and _registry.pid == self._pid:
            _registry.drop(self._token)
        return Future.finished(runtime(), "RDMABuffer.drop")

    # the reader's side ----------------------------------------------------------------
    def _same_host(self) -> bool:
        return _BACKEND == "shm" and self._boot == _BOOT

    def _by_ipc_here(self) -> bool:
        return self._same_host() and self._ipc is not None and device.ipc_enabled()

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
            vm.vm_copy(self._pid, ctypes.addressof(seen), self._token_addr, 8, False, deadline)
        except TimeoutError:  # an OSError too, but no news about the owner
            raise
        except OSError as e:
            if e.errno == errno.ESRCH:
                raise SupervisionError(f"the owner of {self!r} is gone") from None
        if seen.value != self._token:
            raise RuntimeError(_dropped(self))

    def _transfer(self, local: Local, nbytes: int, write: bool, deadline: float) -> None:
        self._check_owner()
        if self._cuda:
            if not (self._by_ipc_here() and self._by_ipc(local, nbytes, write, deadline)):
                self._over_tcp(local, nbytes, write, deadline)
        elif self._same_host():
            self._by_vm(local, nbytes, write, deadline)
        else:
            self._over_tcp(local, nbytes, write, deadline)

    def _by_vm(self, local: Local, nbytes: int, write: bool, deadline: float) -> None:
        """Copy between this host memory of the owner's and ``local``, one-sided."""
        self._check_token(deadline)
        try:
            if local.device is None:
                vm.vm_copy(self._pid, local.addr, self._addr, nbytes, write, deadline)
            else:
                device.vm_staged(self._pid, self._addr, local, nbytes, write, deadline)
        except OSError:
            self._check_owner()
            raise
        self._check_token(deadline)  # dropped midway: what was copied may be torn

    def _by_ipc(self, local: Local, nbytes: int, write: bool, deadline: float) -> bool:
        """Copy between the owner's CUDA memory, mapped here by CUDA IPC, and ``local``,
        one-sided; False (nothing copied) when the handle does not open in this process."""
        key = (self._boot, self._pid, self._token)
        try:
            self._check_token(deadline)
            mapped = _mappings.get(key, self._ipc)
            if mapped is None:
                return False
            device.copy_mapped(mapped, local, nbytes, write)
            self._check_token(deadline)  # dropped midway: what was copied may be torn
        except Exception:  # dropped, owner gone, timed out: the mapping may name freed memory
            _mappings.forget(key)
            raise
        return True

    def _timed_out(self, answered: int, chunks: int) -> TimeoutError:
        return TimeoutError(f"RDMA transfer with {self!r} timed out after {answered} of {chunks} chunks; cancelled")

    def _over_tcp(self, local: Local, nbytes: int, write: bool, deadline: float) -> None:
        """Move ``nbytes`` in chunks of ``TCP_CHUNK``, ``TCP_WINDOW`` requests in flight;
        each answer names its chunk (as its port), and a read's is copied to its place
        as it lands (CUDA memory of this process: staged in pinned memory on its way)."""
        inbox, address = sockets.bind_inbox()
        outbox, guard = sockets.Outbox(), wire_frames.ReplayGuard()
        ranges = [(start, min(TCP_CHUNK, nbytes - start)) for start in range(0, nbytes, TCP_CHUNK)]
        op = rdma_ops.WRITE if write else rdma_ops.READ
        # A send returns once its bytes left this process: one staging buffer serves every chunk.
        staging = cuda.ops().pinned_buffer(ranges[0][1]) if write and local.device is not None else None
        try:
            sent, answered = 0, set[int]()
            while len(answered) < len(ranges):
                while sent < len(ranges) and sent - len(answered) < TCP_WINDOW:
                    if time.monotonic() > deadline:
                        raise self._timed_out(len(answered), len(ranges))
                    start, length = ranges[sent]
                    header = {envelope.OP: op, rdma_ops.TOKEN: self._token, rdma_ops.OFFSET: start,
                              rdma_ops.LENGTH: length, envelope.REPLY: address, envelope.PORT: sent}
                    data = local.get(start, length, staging) if write else None
                    if not write and local.device is None:  # its pages faulted in while the answer travels
                        fill.prefault_at(local.addr + start, length)
                    outbox.send(self._server, wire_frames.encode_value(self._cluster, header, data))
                    sent += 1
                while not inbox.poll(int(max(0.0, min(deadline - time.monotonic(), 0.5)) * 1000)):
                    if time.monotonic() > deadline:
                        raise self._timed_out(len(answered), len(ranges))
                    self._check_owner()
                try:
                    message = wire_frames.decode(sockets.recv_frames(inbox), guard)
                except wire_frames.BadMessage:
                    continue  # counted; never acted on
                value = message.value()
                if not message.header[envelope.OK]:
                    if message.header.get(rdma_ops.DROPPED):
                        raise RuntimeError(_dropped(self))
                    raise unpack_exception(value)[0]
                chunk = message.header[envelope.PORT]
                if chunk in answered or not 0 <= chunk < sent:
                    continue
                if not write:
                    start, length = ranges[chunk]
                    local.put(start, memoryview(value).cast("B")[:length])
                answered.add(chunk)
        finally:
            outbox.close_thread_sockets()
            inbox.close(0)


class RDMAAction:
    """A batch of reads and writes, submitted as one unit (Monarch's ``RDMAAction``)."""

    def __init__(self):
        self._ops: list[tuple[RDMABuffer, Local, int, bool]] = []

    def read_remote(self, dst: Any, src: RDMABuffer) -> "RDMAAction":
        """Queue a read of ``src`` into ``dst``; ``ValueError`` if ``dst`` is smaller than ``src``."""
        memory = local_memory(dst, writable=True)
        if memory.nbytes < src.size():
            raise ValueError(f"destination of {memory.nbytes} bytes is smaller than the {src.size()}-byte RDMABuffer")
        self._ops.append((src, memory, src.size(), False))
        return self

    def write_remote(self, dst: RDMABuffer, src: Any) -> "RDMAAction":
        """Queue a write of ``src`` into ``dst``; ``ValueError`` if ``src`` is larger than
        ``dst``, or ``dst`` is over read-only memory (a memoryview of ``bytes``)."""
        if getattr(dst, "_readonly", False):
            raise ValueError(f"{dst!r} is over read-only memory: it can be read, not written "
                             "(make it over a bytearray, a writable memoryview or a tensor)")
        memory = local_memory(src, writable=False)
        if memory.nbytes > dst.size():
            raise ValueError(f"source of {memory.nbytes} bytes is larger than the {dst.size()}-byte RDMABuffer")
        self._ops.append((dst, memory, memory.nbytes, True))
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
                for buffer, memory, nbytes, write in ops:
                    buffer._transfer(memory, nbytes, write, deadline)
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
