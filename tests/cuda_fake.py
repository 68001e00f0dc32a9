"""A fake of ``monarch_nb.wire.cuda.CudaOps`` for machines without a GPU.

A "CUDA tensor" is a CPU tensor this fake marked as living on ``cuda:N``
(:meth:`FakeCuda.tensor`); every call is recorded, so tests check what the message path
asked of CUDA (pinned staging, the device a tensor was rebuilt on, IPC opens and
releases) without a GPU.

:meth:`FakeCuda.shared` makes a "CUDA tensor" that another process of this host can map,
as CUDA IPC maps device memory: its memory is a memfd, and its IPC handle names the
owner's pid and fd (opened through ``/proc/PID/fd``, which needs what ``RDMABuffer``'s
``"shm"`` backend needs already). Writes through a mapping land in the owner's tensor;
``ipc_open`` of its handle in another process copies it, as a receiver of a CUDA tensor
sent by CUDA IPC does. Any other fake CUDA tensor opens only in its own process (another
process gets ``RuntimeError``, as from a GPU it can't map).
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from typing import Any

import torch

_MEMFD = "fake-cuda-memfd"  # the first item of a handle of a shared() tensor


class FakeCuda:
    """``devices``: how many CUDA devices this process "sees" (0: no CUDA)."""

    def __init__(self, devices: int = 1, ipc_opens: bool = True):
        self.devices = devices
        self.ipc_opens = ipc_opens  # False: ipc_open raises, as another host's process would
        self.ipc_shares = True  # False: ipc_share raises, as for memory CUDA IPC can't export
        self.calls: list[tuple] = []
        self._on: dict[int, tuple[weakref.ref, int]] = {}  # id(tensor) -> (ref, device index)
        self._shared: dict[int, weakref.ref] = {}  # handle -> the sender's tensor (one process: tests)
        self._memfds: dict[int, tuple[weakref.ref, int, Any]] = {}  # id(tensor) -> (ref, fd, dtype): shared()
        self._lock = threading.Lock()
        self.opening = threading.Event()  # set when ipc_open starts
        self.may_copy = threading.Event()  # ipc_open copies once this is set (tests hold it)
        self.may_copy.set()

    def tensor(self, cpu: Any, index: int = 0) -> Any:
        """Mark CPU tensor ``cpu`` as a CUDA tensor on ``cuda:index``; returns it."""
        self._on[id(cpu)] = (weakref.ref(cpu), index)
        return cpu

    def shared(self, cpu: Any, index: int = 0) -> Any:
        """A fake CUDA tensor on ``cuda:index`` holding a copy of 1-D CPU tensor ``cpu``,
        in memory another process of this host can map (:meth:`ipc_map`)."""
        nbytes = cpu.numel() * cpu.element_size()
        fd = os.memfd_create("monarch-nb-fake-cuda")  # freed with the last process that maps it
        os.ftruncate(fd, nbytes)
        memory = mmap.mmap(fd, nbytes)
        tensor = torch.frombuffer(memory, dtype=torch.uint8).view(cpu.dtype)
        tensor.copy_(cpu)
        self._memfds[id(tensor)] = (weakref.ref(tensor), fd, cpu.dtype)
        weakref.finalize(tensor, os.close, fd)
        return self.tensor(tensor, index)

    def _index(self, tensor: Any) -> int | None:
        known = self._on.get(id(tensor))
        return known[1] if known is not None and known[0]() is tensor else None

    # CudaOps
    def is_cuda(self, tensor: Any) -> bool:
        return self._index(tensor) is not None

    def device_index(self, tensor: Any) -> int:
        index = self._index(tensor)
        assert index is not None, "not a (fake) CUDA tensor"
        return index

    def device_count(self) -> int:
        return self.devices

    def to_host(self, tensor: Any, pinned: bool) -> Any:
        self.calls.append(("to_host", pinned))
        return tensor.detach().contiguous().clone()

    def to_device(self, host: Any, index: int) -> Any:
        assert 0 <= index < self.devices, f"cuda:{index} does not exist here"
        self.calls.append(("to_device", index))
        return self.tensor(host.clone(), index)

    def ipc_share(self, tensor: Any) -> Any:
        if not self.ipc_shares:
            self.calls.append(("ipc_share", None))
            raise RuntimeError("fake: this memory can't be shared by CUDA IPC")
        memfd = self._memfds.get(id(tensor))
        if memfd is not None and memfd[0]() is tensor:
            self.calls.append(("ipc_share", _MEMFD))
            return (_MEMFD, os.getpid(), memfd[1], memfd[2], self._index(tensor))
        handle = id(tensor)
        with self._lock:  # not a reference: what keeps the tensor alive is the code under test
            self._shared[handle] = weakref.ref(tensor)
        self.calls.append(("ipc_share", handle))
        return handle

    def ipc_open(self, handle: Any) -> Any:
        self.calls.append(("ipc_open", handle))
        if not self.ipc_opens:
            raise RuntimeError("fake: this process can't open CUDA IPC handles")
        self.opening.set()
        self.may_copy.wait()
        if isinstance(handle, tuple) and handle[0] == _MEMFD:  # another process's shared(): map and copy
            mapped = self.ipc_map(handle)
            return self.tensor(mapped.detach().clone(), self.device_index(mapped))
        with self._lock:
            known = self._shared.get(handle)
        if known is None:  # a tensor of another process not made by shared(): as an unmappable GPU
            raise RuntimeError("fake: only a tensor made by FakeCuda.shared can be opened by another process")
        source = known()
        if source is None:
            raise AssertionError("fake: the shared tensor was freed before the receiver copied it")
        return self.tensor(source.detach().clone(), self._index(source) or 0)

    def ipc_map(self, handle: Any) -> Any:
        self.calls.append(("ipc_map",))
        if not self.ipc_opens:
            raise RuntimeError("fake: this process can't open CUDA IPC handles")
        if not (isinstance(handle, tuple) and handle[0] == _MEMFD):
            raise RuntimeError("fake: only a tensor made by FakeCuda.shared can be mapped")
        _, pid, fd, dtype, index = handle
        with open(f"/proc/{pid}/fd/{fd}", "r+b") as f:
            memory = mmap.mmap(f.fileno(), 0)
        return self.tensor(torch.frombuffer(memory, dtype=torch.uint8).view(dtype), min(index, self.devices - 1))

    def pinned_buffer(self, nbytes: int) -> memoryview:
        self.calls.append(("pinned_buffer", nbytes))
        return memoryview(bytearray(nbytes))

    def copy_to_host(self, tensor: Any, offset: int, out: memoryview) -> None:
        assert self.is_cuda(tensor), "fake: copy_to_host of a tensor that is not on a (fake) device"
        self.calls.append(("copy_to_host", offset, len(out)))
        torch.frombuffer(out, dtype=torch.uint8).copy_(_bytes(tensor)[offset:offset + len(out)])

    def copy_from_host(self, tensor: Any, offset: int, data: memoryview) -> None:
        assert self.is_cuda(tensor), "fake: copy_from_host into a tensor that is not on a (fake) device"
        self.calls.append(("copy_from_host", offset, len(data)))
        _bytes(tensor)[offset:offset + len(data)].copy_(torch.frombuffer(data, dtype=torch.uint8))

    def copy_on_device(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int) -> None:
        assert self.is_cuda(dst) and self.is_cuda(src), "fake: copy_on_device between non-device tensors"
        self.calls.append(("copy_on_device", nbytes))
        _bytes(dst)[dst_offset:dst_offset + nbytes].copy_(_bytes(src)[src_offset:src_offset + nbytes])


def _bytes(tensor: Any) -> Any:
    tensor = tensor.detach()
    return tensor if tensor.dtype == torch.uint8 else tensor.view(torch.uint8)
