"""The memory of this process that an ``RDMABuffer`` registers, or that a transfer reads
into or writes from: host memory at an address, or a CUDA tensor. Every CUDA call goes
through ``wire.cuda.ops()``; nothing here imports torch."""

from __future__ import annotations

import ctypes
import sys
from typing import Any

from ..wire import cuda


def host_view(addr: int, nbytes: int) -> memoryview:
    """A writable memoryview (format "B") of ``nbytes`` of this process's memory at ``addr``."""
    return memoryview((ctypes.c_char * nbytes).from_address(addr)).cast("B")


def address_of(view: memoryview) -> tuple[int, Any]:
    """``(address, keepalive)`` of 1-D C-contiguous ``view``, read-only or not."""
    if view.nbytes == 0:
        return 0, view
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view)), view
    except TypeError:  # read-only: numpy gives its address without a copy
        import numpy as np

        array = np.frombuffer(view, np.uint8)
        return array.ctypes.data, (view, array)


class Local:
    """``nbytes`` of this process's memory: host memory at ``addr``, or, when ``device``
    is set, that CUDA tensor (1-D, contiguous; ``addr`` is 0). ``keep`` is what keeps
    the memory alive while a transfer uses it (or, registered, for the buffer's life);
    ``readonly``: nothing may be written into it."""

    __slots__ = ("addr", "nbytes", "keep", "device", "readonly")

    def __init__(self, addr: int, nbytes: int, keep: Any, device: Any = None, readonly: bool = False):
        self.addr, self.nbytes, self.keep, self.device, self.readonly = addr, nbytes, keep, device, readonly

    def put(self, start: int, data: memoryview) -> None:
        """Copy ``data`` (bytes, any host memory) into this memory at byte ``start``."""
        n = data.nbytes
        if n == 0:
            return
        src, keep = address_of(data)
        if self.device is None:
            ctypes.memmove(self.addr + start, src, n)
        else:  # a writable view of the same bytes: torch warns on read-only buffers
            cuda.ops().copy_from_host(self.device, start, host_view(src, n))
        del keep

    def get(self, start: int, length: int, staging: memoryview | None) -> memoryview:
        """The bytes ``[start, start + length)`` of this memory, in host memory: a view
        of them, or for CUDA memory a copy in ``staging`` (at least ``length`` bytes),
        which is returned cut to ``length``."""
        if self.device is None:
            return host_view(self.addr + start, length)
        assert staging is not None and staging.nbytes >= length, "CUDA memory is read through staging"
        out = staging[:length]
        cuda.ops().copy_to_host(self.device, start, out)
        return out


def local_memory(obj: Any, writable: bool) -> Local:
    """The :class:`Local` of a 1-D contiguous tensor (CPU or CUDA) or memoryview.

    Raises ``ValueError`` otherwise (or when ``writable`` is asked of read-only memory),
    ``NotImplementedError`` for a tensor of another device type (``mps``, ``xla``)."""
    torch = sys.modules.get("torch")  # never imported here: a tensor means the caller has it
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.dim() != 1 or not obj.is_contiguous():
            raise ValueError(f"RDMA memory must be a 1-D contiguous tensor, got shape {tuple(obj.shape)}; "
                             "use t.contiguous().view(-1)")
        nbytes = obj.numel() * obj.element_size()
        if cuda.ops().is_cuda(obj):
            return Local(0, nbytes, obj, obj)
        if obj.device.type != "cpu":
            raise NotImplementedError(f"monarch_nb.rdma supports CPU and CUDA tensors, not {obj.device.type} "
                                      "ones; copy it to the CPU first")
        # The storage, not the tensor: `t.data = other` or a `resize_` that moves it frees the
        # memory at data_ptr() while the tensor lives on (a registered buffer then read
        # freed memory, and a write into it corrupted the owner's heap).
        return Local(obj.data_ptr(), nbytes, (obj, obj.untyped_storage()))
    if isinstance(obj, memoryview):
        if obj.ndim != 1 or not obj.c_contiguous:
            raise ValueError(f"RDMA memory must be a 1-D C-contiguous memoryview, got shape {obj.shape}")
        if writable and obj.readonly:
            raise ValueError("RDMA destination is read-only; pass a writable memoryview")
        addr, keep = address_of(obj)
        return Local(addr, obj.nbytes, keep, readonly=obj.readonly)
    raise ValueError(f"RDMA memory must be a torch.Tensor or memoryview, got {type(obj).__name__}")
