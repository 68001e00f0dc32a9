"""Pickling with out-of-band buffers (PEP 574, pickle protocol 5).

Large contiguous buffers are not copied into the pickle stream: they come back from
:func:`dumps` as separate buffers, which the transport sends as their own zmq frames
without copying. What the receiver gets, for arguments and return values alike:

- numpy arrays and CPU torch tensors: the same type, dtype and shape, writable, backed
  by the received frame (no copy on either side);
- ``memoryview``: a ``memoryview`` of the same format and shape, writable when the
  caller's was, over the received frame (no copy on either side when C-contiguous);
- ``bytes`` and ``bytearray`` of ``OUT_OF_BAND_MIN_BYTES`` or more: the same type, so
  endpoint code sees what the caller passed. The sender does not copy; the receiver
  copies once, because a ``bytes`` object can't own memory it did not allocate. Large
  ones are copied piece by piece out of the shared-memory segment or the socket's
  frames, each piece freed once copied (``wire.shm``, ``wire.fill``), so the receiver
  holds the value once, not twice; the transport then hands the finished object to
  :func:`loads`, which keeps it. Pass a numpy array, a tensor or a memoryview for no
  copy at all.

Smaller bytes-like values stay in the pickle stream, where they cost less than a frame.

torch is never imported here; tensors get the out-of-band path only when torch is
already imported by the caller (``"torch" in sys.modules``). A CUDA tensor goes by CUDA
IPC when every receiver is a process of this host (``wire.cuda_ipc``; :func:`dumps`'
``destinations``), else it is staged through host memory and rebuilt on the receiver's
GPU (``wire.cuda_tensors``).

A class defined here (a notebook's ``class Cfg``) is pickled by value, and a value of
it coming back names the same class: cloudpickle then finds this process's own class
and would overwrite its attributes with the sender's copy (``Cfg.level = 3`` in the
kernel reset to the worker's 1 by a returned ``Cfg()``). :func:`loads` never lets a
value change a class of this process's own; a class it made from a pickle is still
updated by later pickles, so a worker follows the notebook's edits.
"""

from __future__ import annotations

import io
import marshal
import pickle
import sys
import types
import weakref
from typing import Any, Collection

import cloudpickle

from ..errors import SerializationError

PROTOCOL = 5

# bytes-like values at least this large travel as their own frame (a frame costs a few
# microseconds; copying 64 KiB into the stream costs about as much).
OUT_OF_BAND_MIN_BYTES = 1 << 16


def _rebuild_tensor(array, torch_dtype, requires_grad, dims=None):
    """``dims``: the sender's dimensions in the order ``array`` holds them (a permuted
    tensor's layout, see :func:`_memory_order`), put back in place here."""
    import torch

    tensor = torch.from_numpy(array)
    if tensor.dtype != torch_dtype:
        tensor = tensor.view(torch_dtype)
    if dims is not None:
        tensor = tensor.permute([dims.index(d) for d in range(len(dims))])
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor


# numpy has no bfloat16 (and friends): send their bits under an integer dtype of the
# same width and view them back on arrival.
_BITS_AS = {2: "int16", 1: "uint8"}


def _as_array(data):
    """The numpy array over contiguous CPU tensor ``data``'s memory (no copy); None for a
    dtype numpy can't hold, even as bits."""
    try:
        return data.numpy()
    except TypeError:  # dtype without a numpy twin, e.g. bfloat16
        import torch

        as_int = getattr(torch, _BITS_AS.get(data.element_size(), ""), None)
        return None if as_int is None else data.view(as_int).numpy()


def _memory_order(data) -> list[int] | None:
    """For a tensor whose elements fill its memory without gaps in some order of its
    dimensions (``channels_last``, a transpose): those dimensions, outermost first, such
    that ``data.permute(order)`` is contiguous; ``None`` for one with gaps (a slice)."""
    order = sorted(range(data.dim()), key=lambda d: -data.stride(d))  # (stable: ties keep their order)
    return order if data.permute(order).is_contiguous() else None


def _reduce_tensor(tensor, reduce_cuda):
    import torch

    # Only a plain dense tensor goes out of band here; the others as stock pickle sends
    # them (torch's own reduce): a sparse, quantized or nested one, one with its conjugate
    # or negative bit set (numpy() refuses those), and one with a stride of 0 (an
    # ``expand``: its storage is a few elements, its contiguous copy may be gigabytes).
    if tensor.layout is not torch.strided or tensor.is_quantized or tensor.is_nested or tensor.is_conj() \
            or tensor.is_neg() or 0 in tensor.stride():
        return NotImplemented
    # Imported here, with the first tensor: a client that never sends one (or a fresh
    # one, connecting) does not compile and load the CUDA paths.
    from . import cuda as _cuda

    if _cuda.ops().is_cuda(tensor):
        return reduce_cuda(tensor)
    if tensor.device.type != "cpu":
        return NotImplemented
    data = tensor.detach()
    dims = None
    if not data.is_contiguous():
        # Dense in another order (channels_last, a transpose): its memory as it lies, and
        # the order to view it back in, so its strides (and memory format) arrive as they
        # were; with gaps (a slice): its contiguous copy, not the storage around it.
        dims = _memory_order(data)
        data = data.contiguous() if dims is None else data.permute(dims)
    array = _as_array(data)
    if array is None:
        return NotImplemented
    return (_rebuild_tensor, (array, tensor.dtype, tensor.requires_grad, dims))


def _reduce_code(code: types.CodeType):
    # cloudpickle renames the file of code it pickles by value to "<dynamic-code>".
    # Keep the real one (a module path, or a notebook cell's file): tracebacks from
    # procs name it, and breakpoints set by file and line match it. marshal carries
    # every field; both ends run the same Python (as cloudpickle's code objects need).
    return marshal.loads, (marshal.dumps(code),)


_BYTES_LIKE = frozenset((bytes, bytearray, memoryview))


def _rebuild_memoryview(buffer, fmt, shape):
    if len(shape) == 1 and not shape[0]:  # empty: cast refuses a shape holding a 0
        return memoryview(buffer).cast("B").cast(fmt)
    return memoryview(buffer).cast("B").cast(fmt, shape)


def _check_rebuildable(view: memoryview) -> None:
    """Raise ``PicklingError`` (a ``SerializationError`` from :func:`dumps`) for a
    memoryview that :func:`_rebuild_memoryview` can't make again on arrival: a format
    ``memoryview.cast`` refuses (byte order or struct syntax: ``>d``, ``T{...}``) or a
    shape holding a 0. It was sent, and the call failed in the actor before the endpoint
    ran (or its reply could not be read). Stock pickle refuses every memoryview."""
    try:
        memoryview(bytearray(view.itemsize)).cast("B").cast(view.format)  # type: ignore[call-overload]  # any format
        ok = 0 not in (view.shape or ()) or view.ndim == 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise pickle.PicklingError(
            f"a memoryview of format {view.format!r} and shape {view.shape} can't be rebuilt where it arrives; "
            "send bytes(view), or a numpy array (np.asarray(view)) which keeps its dtype and shape")


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        kind, buffer, *shape = pid
        if kind is memoryview:
            return _rebuild_memoryview(buffer, *shape)
        if kind is bytes or kind is bytearray:
            if type(buffer) is kind:  # the transport already made it (wire.fill): no copy
                return buffer
            return kind(buffer)  # the one copy: these types own their memory
        raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")

    def find_class(self, module: str, name: str):
        if module == "cloudpickle.cloudpickle" and name in _GUARDED:
            return _GUARDED[name]
        return super().find_class(module, name)


class _Pickler(cloudpickle.Pickler):
    # bytes and bytearray never reach reducer_override (the C pickler saves them
    # first), but persistent_id sees every object: a bytes-like value becomes an id
    # holding a PickleBuffer, which pickle sends out of band (see _Unpickler).
    def __init__(self, *args, destinations: Collection[str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._ids: dict[int, tuple] = {}  # id(obj) -> (persistent id, obj: kept so the id stays its)
        self._destinations = destinations
        self._cuda_by_ipc: bool | None = None  # decided at the message's first CUDA tensor

    def _reduce_cuda(self, tensor):
        """CUDA ``tensor`` by CUDA IPC or staged through host memory, as
        ``wire.cuda_ipc.by_ipc`` decides for this message's destinations."""
        from . import cuda_ipc as _cuda_ipc
        from . import cuda_tensors as _cuda_tensors

        if self._cuda_by_ipc is None:
            self._cuda_by_ipc = _cuda_ipc.by_ipc(self._destinations)
        if self._cuda_by_ipc:
            return _cuda_ipc.reduce(tensor, None if self._destinations is None else len(self._destinations))
        return _cuda_tensors.reduce(tensor, _as_array)

    def persistent_id(self, obj):
        kind = type(obj)
        if kind is memoryview:
            _check_rebuildable(obj)
        if kind in _BYTES_LIKE and (obj.nbytes if kind is memoryview else len(obj)) >= OUT_OF_BAND_MIN_BYTES:
            known = self._ids.get(id(obj))
            if known is not None:  # the same object again: the same (memoized) id, one frame
                return known[0]
            if kind is memoryview:
                view = obj if obj.c_contiguous else memoryview(obj.tobytes()).cast(obj.format, obj.shape)
                pid = (memoryview, pickle.PickleBuffer(view), view.format, view.shape)
            else:
                pid = (kind, pickle.PickleBuffer(obj))
            self._ids[id(obj)] = (pid, obj)
            return pid
        return None

    def reducer_override(self, obj):
        kind = type(obj)
        if kind is memoryview:  # a small one (large ones are persistent ids)
            data = obj.tobytes()
            return _rebuild_memoryview, (data if obj.readonly else bytearray(data), obj.format, obj.shape)
        if kind is types.CodeType:
            return _reduce_code(obj)
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) is torch.Tensor:
            return _reduce_tensor(obj, self._reduce_cuda)
        return super().reducer_override(obj)


_ATOMS = frozenset((type(None), bool, int, float, str))
_PLAIN_MAX = 64  # objects looked at before a value counts as not plain


def _plain(obj: Any) -> bool:
    """Whether ``obj`` is builtin data the standard pickler writes as ours would, with
    nothing out of band: ``None``, bools, ints, floats, strings, bytes and bytearrays
    under ``OUT_OF_BAND_MIN_BYTES``, and tuples, lists and dicts of them, ``_PLAIN_MAX``
    objects at most. Most small calls and replies are; they skip cloudpickle's
    Python-level pickler (a per-object callback) for the C one, a few times faster."""
    stack, budget, atoms = [obj], _PLAIN_MAX, _ATOMS
    pop, extend = stack.pop, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind in atoms:
            continue
        if kind is tuple or kind is list:
            extend(item)
        elif kind is dict:
            extend(item)
            extend(item.values())
        elif kind is bytes or kind is bytearray:
            if len(item) >= OUT_OF_BAND_MIN_BYTES:
                return False
            continue
        else:
            return False
        budget -= len(item) + 1
        if budget < 0:  # also ends a list that holds itself
            return False
    return True


def dumps(obj: Any, what: str = "value",
          destinations: Collection[str] | None = None) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle ``obj``; returns ``(stream, out_of_band_buffers)``. ``destinations``: the
    addresses of the processes the stream goes to, when the caller knows them (a CUDA
    tensor then goes by CUDA IPC if all are of this host: ``wire.cuda_ipc.by_ipc``;
    without them it is staged, unless ``MONARCH_NB_CUDA_IPC=1``).

    Raises :class:`SerializationError` naming ``what`` when pickle refuses ``obj`` (a
    lock, a file, a generator...). What an object's own ``__getstate__`` or
    ``__reduce__`` raises is that code's error: it propagates as it is (as in Monarch),
    with a note naming ``what``; so does the ``ValueError`` of a bad ``MONARCH_NB_CUDA_IPC``
    (raised only for a value holding a CUDA tensor).
    """
    if _plain(obj):
        return pickle.dumps(obj, protocol=PROTOCOL), []
    buffers: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    try:
        _Pickler(stream, protocol=PROTOCOL, buffer_callback=buffers.append, destinations=destinations).dump(obj)
    except (TypeError, AttributeError, RecursionError, pickle.PicklingError) as e:
        raise SerializationError(
            f"{what} could not be pickled ({type(e).__name__}: {e}); pass only picklable "
            "values (no open files, sockets, locks or generators), or create such objects "
            "inside the actor"
        ) from e
    except Exception as e:
        if hasattr(e, "add_note"):  # Python >= 3.11
            e.add_note(f"(raised while pickling {what})")
        raise
    return stream.getvalue(), buffers


_cloudpickle = cloudpickle.cloudpickle
# Classes this process made from a pickle: their sender owns them, and may update them.
_reconstructed: "weakref.WeakSet[type]" = weakref.WeakSet()


def _tracked(make: Any, tracker_id_at: int):
    """``make`` (cloudpickle's skeleton maker), noting the classes it creates rather
    than finds (argument ``tracker_id_at`` is the class's tracker id)."""
    def make_or_find(*args):
        tracker_id = args[tracker_id_at]
        known = tracker_id is not None and tracker_id in _cloudpickle._DYNAMIC_CLASS_TRACKER_BY_ID
        cls = make(*args)
        if not known:
            _reconstructed.add(cls)
        return cls
    return make_or_find


def _class_setstate(cls, state):
    """cloudpickle's, except on a class of this process's own (never made from a pickle)."""
    if cls in _cloudpickle._DYNAMIC_CLASS_TRACKER_BY_CLASS and cls not in _reconstructed:
        return cls
    return _cloudpickle._class_setstate(cls, state)


_GUARDED = {
    "_make_skeleton_class": _tracked(_cloudpickle._make_skeleton_class, 4),
    "_make_skeleton_enum": _tracked(_cloudpickle._make_skeleton_enum, 5),
    "_class_setstate": _class_setstate,
}


def loads(stream, buffers=()) -> Any:
    """Inverse of :func:`dumps`; never changes a class of this process's own (see the
    module docstring). Only ever call on verified (signed) frames."""
    return _Unpickler(io.BytesIO(stream), buffers=buffers).load()
