"""Pickling with out-of-band buffers (PEP 574, pickle protocol 5).

Large contiguous buffers (numpy arrays, CPU torch tensors, bytes-like objects) are
not copied into the pickle stream: they come back from :func:`dumps` as separate
buffers, which the transport sends as their own zmq frames without copying.

torch is never imported here; tensors get the out-of-band path only when torch is
already imported by the caller (``"torch" in sys.modules``).
"""

from __future__ import annotations

import io
import marshal
import pickle
import sys
import types
from typing import Any

import cloudpickle

from ..errors import SerializationError

PROTOCOL = 5


def _rebuild_tensor(array, torch_dtype, requires_grad):
    import torch

    tensor = torch.from_numpy(array)
    if tensor.dtype != torch_dtype:
        tensor = tensor.view(torch_dtype)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor


# numpy has no bfloat16 (and friends): send their bits under an integer dtype of the
# same width and view them back on arrival.
_BITS_AS = {2: "int16", 1: "uint8"}


def _reduce_tensor(tensor):
    import torch

    if tensor.device.type != "cpu" or tensor.is_sparse or tensor.is_quantized:
        return NotImplemented
    data = tensor.detach()
    if not data.is_contiguous():
        data = data.contiguous()
    try:
        array = data.numpy()
    except TypeError:  # dtype without a numpy twin, e.g. bfloat16
        as_int = getattr(torch, _BITS_AS.get(data.element_size(), ""), None)
        if as_int is None:
            return NotImplemented
        array = data.view(as_int).numpy()
    return (_rebuild_tensor, (array, tensor.dtype, tensor.requires_grad))


def _reduce_code(code: types.CodeType):
    # cloudpickle renames the file of code it pickles by value to "<dynamic-code>".
    # Keep the real one (a module path, or a notebook cell's file): tracebacks from
    # procs name it, and breakpoints set by file and line match it. marshal carries
    # every field; both ends run the same Python (as cloudpickle's code objects need).
    return marshal.loads, (marshal.dumps(code),)


class _Pickler(cloudpickle.Pickler):
    def reducer_override(self, obj):
        if type(obj) is types.CodeType:
            return _reduce_code(obj)
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) is torch.Tensor:
            return _reduce_tensor(obj)
        return super().reducer_override(obj)


def dumps(obj: Any, what: str = "value") -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle ``obj``; returns ``(stream, out_of_band_buffers)``.

    Raises :class:`SerializationError` naming ``what`` when pickle refuses ``obj`` (a
    lock, a file, a generator...). What an object's own ``__getstate__`` or
    ``__reduce__`` raises is that code's error: it propagates as it is (as in Monarch),
    with a note naming ``what``.
    """
    buffers: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    try:
        _Pickler(stream, protocol=PROTOCOL, buffer_callback=buffers.append).dump(obj)
    except (TypeError, AttributeError, RecursionError, pickle.PicklingError) as e:
        raise SerializationError(
            f"{what} could not be pickled ({type(e).__name__}: {e}); pass only picklable "
            "values (no open files, sockets, locks or generators), or create such objects "
            "inside the actor"
        ) from e
    except Exception as e:
        e.add_note(f"(raised while pickling {what})")
        raise
    return stream.getvalue(), buffers


def loads(stream, buffers=()) -> Any:
    """Inverse of :func:`dumps`. Only ever call on verified (signed) frames."""
    return pickle.loads(stream, buffers=buffers)
