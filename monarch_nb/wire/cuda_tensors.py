"""CUDA tensors in messages: staged through host memory, rebuilt on the receiver's GPU.

A CUDA tensor in an argument or a result is copied to host memory (pinned when the
platform can pin) and travels as an out-of-band buffer exactly like a CPU tensor (through
shared memory on one host, as its own frames across hosts). The receiver rebuilds it:

- on ``cuda:N``, N the index the tensor had in the sender, when the receiver sees more
  than N devices (indices are the process's own: a proc bound to one GPU sees it as
  ``cuda:0``);
- on ``cuda:0`` when the receiver sees fewer devices;
- as a CPU tensor over the received frame when the receiver has no CUDA (a client
  notebook without a GPU still sees the values), with one :class:`CudaTensorOnCpuWarning`
  per process.

dtype, shape and ``requires_grad`` are kept; the rebuilt tensor is contiguous and has no
autograd history (as a CPU tensor's). The receiver's copy is its own (messages are
values). Every CUDA call goes through :mod:`wire.cuda`'s ``ops()``.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from . import cuda


class CudaTensorOnCpuWarning(RuntimeWarning):
    """A CUDA tensor arrived in a process without CUDA and became a CPU tensor there."""


_warned = False  # one warning per process (a value mesh of 64 tensors warns once)


def reduce(tensor: Any, as_array: Callable[[Any], Any]) -> Any:
    """The pickle reduction of CUDA tensor ``tensor``: its data staged in host memory
    (``as_array`` turns a contiguous CPU tensor into the numpy array that travels out of
    band, or None when it can't, as for serialize's CPU tensors); NotImplemented leaves
    the tensor to torch's own pickling."""
    ops = cuda.ops()
    array = as_array(ops.to_host(tensor, pinned=True))
    if array is None:
        return NotImplemented
    return rebuild, (array, tensor.dtype, tensor.requires_grad, ops.device_index(tensor))


def target_device(index: int, count: int) -> int | None:
    """Where a tensor that was on ``cuda:index`` is rebuilt in a process that sees
    ``count`` devices: that index if it exists, else 0; None without CUDA (CPU)."""
    if count <= 0:
        return None
    return index if index < count else 0


def rebuild(array: Any, dtype: Any, requires_grad: bool, index: int) -> Any:
    """Inverse of :func:`reduce`, run by the receiver's unpickler."""
    import torch

    host = torch.from_numpy(array)
    if host.dtype != dtype:
        host = host.view(dtype)
    tensor = place(host, index)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor


def place(host: Any, index: int) -> Any:
    """CPU tensor ``host`` (the data of a tensor that was on the sender's ``cuda:index``)
    put where this process keeps it: see :func:`target_device`; ``host`` itself, with
    the once-per-process warning, without CUDA."""
    ops = cuda.ops()
    device = target_device(index, ops.device_count())
    if device is None:
        _warn_on_cpu(index, host)
        return host
    return ops.to_device(host, device)


def _warn_on_cpu(index: int, host: Any) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        f"a CUDA tensor (cuda:{index}, {host.dtype}, shape {tuple(host.shape)}) arrived in a "
        "process without CUDA and is a CPU tensor here (so are later ones; this is said once). "
        "Receive CUDA tensors where torch.cuda.is_available(), or send tensor.cpu() to mean it",
        CudaTensorOnCpuWarning, stacklevel=2)
