"""Every CUDA call the message path and ``RDMABuffer`` make, behind one small interface.

:class:`CudaOps` is what ``wire.cuda_tensors``, ``wire.cuda_ipc`` and ``monarch_nb.rdma``
ask of CUDA; :class:`TorchCuda` does it
with torch. Tests put a fake in its place with :func:`use` and check lifetimes and error
paths on a machine without a GPU. Nothing here imports torch at import time: a method
runs only for a tensor the caller made, so torch is already imported then (the one
exception, :meth:`TorchCuda.device_count`, is called by a receiver that is rebuilding a
tensor, which imports torch anyway).
"""

from __future__ import annotations

from typing import Any, Protocol


class CudaOps(Protocol):
    """What the message path needs from CUDA. ``tensor`` arguments are ``torch.Tensor``."""

    def is_cuda(self, tensor: Any) -> bool:
        """Whether ``tensor`` lives in CUDA memory (and takes the CUDA paths)."""
        ...

    def device_index(self, tensor: Any) -> int:
        """The index of ``tensor``'s device in this process (``cuda:N`` -> N)."""
        ...

    def device_count(self) -> int:
        """CUDA devices this process sees; 0 without CUDA (also with a CPU-only torch)."""
        ...

    def to_host(self, tensor: Any, pinned: bool) -> Any:
        """A contiguous CPU copy of ``tensor``'s data (detached: no autograd history),
        in pinned memory when ``pinned`` and the platform can pin; the copy is complete
        on return."""
        ...

    def to_device(self, host: Any, index: int) -> Any:
        """A copy of CPU tensor ``host`` on device ``cuda:index``, complete on return
        (``host``'s memory may be freed right after)."""
        ...

    def ipc_share(self, tensor: Any) -> Any:
        """A picklable handle through which another process of this host opens
        ``tensor``'s memory; the caller keeps ``tensor`` alive while it may be opened."""
        ...

    def ipc_open(self, handle: Any) -> Any:
        """A copy, in this process's own allocation on its device of the same physical
        GPU, of the tensor ``handle`` shares; the shared memory is closed on return.
        Raises ``RuntimeError`` (or ``OSError``) when this process can't open it
        (another host, another GPU, a container without IPC)."""
        ...

    # Byte ranges, for RDMABuffer. ``tensor`` is 1-D and contiguous; offsets and lengths
    # are in bytes; host memory is a writable memoryview of format "B". Each copy is
    # complete on return.

    def ipc_map(self, handle: Any) -> Any:
        """The tensor that ``handle`` (from :meth:`ipc_share`) shares, mapped into this
        process without a copy: writes through it land in the owner's memory. The
        mapping closes when the returned tensor is freed. Raises ``RuntimeError`` (or
        ``OSError``) when this process can't open it."""
        ...

    def pinned_buffer(self, nbytes: int) -> memoryview:
        """``nbytes`` of host memory for staging, pinned when the platform can pin."""
        ...

    def copy_to_host(self, tensor: Any, offset: int, out: memoryview) -> None:
        """Copy ``len(out)`` bytes of CUDA ``tensor`` from byte ``offset`` into ``out``."""
        ...

    def copy_from_host(self, tensor: Any, offset: int, data: memoryview) -> None:
        """Copy ``data`` into CUDA ``tensor`` at byte ``offset``."""
        ...

    def copy_on_device(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int) -> None:
        """Copy ``nbytes`` from CUDA ``src`` at ``src_offset`` to CUDA ``dst`` at
        ``dst_offset`` (the two may be on different devices)."""
        ...


def _bytes(tensor: Any) -> Any:
    """``tensor`` (1-D, contiguous) as a tensor of its bytes, sharing its memory, outside
    autograd (raw memory, as the host backends copy it)."""
    import torch

    tensor = tensor.detach()
    return tensor if tensor.dtype == torch.uint8 else tensor.view(torch.uint8)


class TorchCuda:
    """:class:`CudaOps` by torch (the real thing)."""

    def is_cuda(self, tensor: Any) -> bool:
        return tensor.is_cuda

    def device_index(self, tensor: Any) -> int:
        return tensor.device.index or 0

    def device_count(self) -> int:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def to_host(self, tensor: Any, pinned: bool) -> Any:
        import torch

        src = tensor.detach()
        if not src.is_contiguous():
            src = src.contiguous()
        host = None
        if pinned:
            try:
                host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
            except RuntimeError:  # pinning refused (locked-memory limit): pageable then
                host = None
        if host is None:
            return src.to("cpu")
        with torch.cuda.device(src.device):
            host.copy_(src, non_blocking=True)
            torch.cuda.current_stream().synchronize()
        return host

    def to_device(self, host: Any, index: int) -> Any:
        return host.to(f"cuda:{index}")

    def ipc_share(self, tensor: Any) -> Any:
        from torch.multiprocessing.reductions import reduce_tensor

        return reduce_tensor(tensor.detach())

    def ipc_open(self, handle: Any) -> Any:
        import torch

        rebuild, args = handle
        shared = rebuild(*args)
        with torch.cuda.device(shared.device):
            copy = shared.clone()
            torch.cuda.current_stream().synchronize()
        del shared  # closes the IPC mapping; torch's counter tells the sender it may free
        return copy

    def ipc_map(self, handle: Any) -> Any:
        rebuild, args = handle
        return rebuild(*args)

    def pinned_buffer(self, nbytes: int) -> memoryview:
        import torch

        try:  # torch's caching host allocator: a buffer of a size freed before comes back at once
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        except RuntimeError:  # pinning refused (locked-memory limit): pageable then
            host = torch.empty(nbytes, dtype=torch.uint8)
        return host.numpy().data  # the array, which it holds, keeps the tensor and its memory alive

    def copy_to_host(self, tensor: Any, offset: int, out: memoryview) -> None:
        import torch

        host = torch.frombuffer(out, dtype=torch.uint8)
        with torch.cuda.device(tensor.device):
            host.copy_(_bytes(tensor)[offset:offset + len(out)], non_blocking=True)
            torch.cuda.current_stream().synchronize()

    def copy_from_host(self, tensor: Any, offset: int, data: memoryview) -> None:
        import torch

        host = torch.frombuffer(data, dtype=torch.uint8)
        with torch.cuda.device(tensor.device):
            _bytes(tensor)[offset:offset + len(data)].copy_(host, non_blocking=True)
            torch.cuda.current_stream().synchronize()

    def copy_on_device(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int) -> None:
        import torch

        with torch.cuda.device(dst.device):
            _bytes(dst)[dst_offset:dst_offset + nbytes].copy_(_bytes(src)[src_offset:src_offset + nbytes])
            torch.cuda.current_stream().synchronize()
        if src.device != dst.device:  # a copy between devices may run on the source's stream too
            torch.cuda.current_stream(src.device).synchronize()


_ops: CudaOps = TorchCuda()


def ops() -> CudaOps:
    """The :class:`CudaOps` in use in this process."""
    return _ops


def use(new: CudaOps) -> CudaOps:
    """Put ``new`` in use (tests: a fake on a machine without a GPU); returns the one it
    replaces, to put back."""
    global _ops
    old, _ops = _ops, new
    return old
