"""CUDA memory in RDMA transfers: the reader's CUDA IPC mappings of owners' CUDA buffers
(one host), and copies between another process's host memory and a CUDA tensor of this
one, staged through pinned host memory in chunks. Every CUDA call goes through
``wire.cuda.ops()``."""

from __future__ import annotations

import os
import pickle
import threading
from collections import OrderedDict
from typing import Any, Hashable

from ..wire import cuda
from .memory import Local, address_of, host_view
from .vm import vm_copy

IPC_ENV = "MONARCH_NB_RDMA_CUDA_IPC"
STAGE_CHUNK = 32 << 20  # bytes of pinned memory a staged copy on one host goes through at a time
MAPPINGS_KEPT = 16  # owners' CUDA buffers a reader keeps mapped (most recently used)


def ipc_enabled() -> bool:
    """Whether this process reads and writes CUDA buffers of its host by CUDA IPC
    (unless ``MONARCH_NB_RDMA_CUDA_IPC=0``: then through the owner, staged)."""
    return os.environ.get(IPC_ENV, "1") != "0"


def export(tensor: Any) -> bytes | None:
    """The owner's CUDA IPC handle of ``tensor``, pickled (so that the RDMABuffer that
    carries it unpickles without torch); None when it can't be shared (readers then
    go through the owner)."""
    try:
        return pickle.dumps(cuda.ops().ipc_share(tensor), protocol=5)
    except Exception:  # noqa: BLE001 - whatever torch refuses to share, readers stage instead
        return None


class Mappings:
    """The owners' CUDA buffers this process has mapped by CUDA IPC, so that a buffer
    read again costs no new open: the ``kept`` most recently used, and those whose
    handle would not open (remembered, so they go staged without trying again). A
    mapping keeps the owner's GPU memory from being reused while it lasts: one is
    forgotten when a transfer finds its buffer dropped or its owner gone, or when
    ``kept`` newer ones push it out."""

    def __init__(self, kept: int = MAPPINGS_KEPT):
        self.kept = kept
        self.unopened = 0  # handles that would not open here (another GPU, no IPC)
        self._lock = threading.Lock()
        self._open: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable, handle: bytes) -> Any | None:
        """The tensor mapped from pickled ``handle`` (opened at the first call for
        ``key``), or None when this process can't open it."""
        with self._lock:
            if key in self._open:
                self._open.move_to_end(key)
                return self._open[key]
        try:
            mapped = cuda.ops().ipc_map(pickle.loads(handle))  # from a signed message, like the handle's buffer
        except (RuntimeError, OSError):
            mapped = None
        with self._lock:
            self.unopened += mapped is None
            self._open[key] = mapped
            while len(self._open) > self.kept:
                self._open.popitem(last=False)
        return mapped

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._open.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return sum(1 for mapped in self._open.values() if mapped is not None)


def copy_mapped(mapped: Any, local: Local, nbytes: int, write: bool) -> None:
    """Copy ``nbytes`` between the start of an owner's mapped CUDA tensor and ``local``:
    device to device, or device to or from host memory."""
    ops = cuda.ops()
    if local.device is not None:
        if write:
            ops.copy_on_device(mapped, 0, local.device, 0, nbytes)
        else:
            ops.copy_on_device(local.device, 0, mapped, 0, nbytes)
        return
    view = host_view(local.addr, nbytes)
    if write:
        ops.copy_from_host(mapped, 0, view)
    else:
        ops.copy_to_host(mapped, 0, view)


def vm_staged(pid: int, remote: int, local: Local, nbytes: int, write: bool, deadline: float) -> None:
    """Copy ``nbytes`` between host memory at ``remote`` in process ``pid`` and CUDA
    memory ``local``, through pinned memory of this process in chunks of
    ``STAGE_CHUNK``; raises like :func:`~.vm.vm_copy`."""
    staging = cuda.ops().pinned_buffer(min(STAGE_CHUNK, nbytes))
    addr, keep = address_of(staging)
    for start in range(0, nbytes, STAGE_CHUNK):
        n = min(STAGE_CHUNK, nbytes - start)
        if write:
            local.get(start, n, staging)
            vm_copy(pid, addr, remote + start, n, True, deadline)
        else:
            vm_copy(pid, addr, remote + start, n, False, deadline)
            local.put(start, staging[:n])
    del keep
