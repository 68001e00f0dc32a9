"""A fake of ``monarch_nb.wire.cuda.CudaOps`` for machines without a GPU.

A "CUDA tensor" is a CPU tensor this fake marked as living on ``cuda:N``
(:meth:`FakeCuda.tensor`); every call is recorded, so tests check what the message path
asked of CUDA (pinned staging, the device a tensor was rebuilt on, IPC opens and
releases) without a GPU.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any


class FakeCuda:
    """``devices``: how many CUDA devices this process "sees" (0: no CUDA)."""

    def __init__(self, devices: int = 1, ipc_opens: bool = True):
        self.devices = devices
        self.ipc_opens = ipc_opens  # False: ipc_open raises, as another host's process would
        self.calls: list[tuple] = []
        self._on: dict[int, tuple[weakref.ref, int]] = {}  # id(tensor) -> (ref, device index)
        self._shared: dict[int, weakref.ref] = {}  # handle -> the sender's tensor (one process: tests)
        self._lock = threading.Lock()
        self.opening = threading.Event()  # set when ipc_open starts
        self.may_copy = threading.Event()  # ipc_open copies once this is set (tests hold it)
        self.may_copy.set()

    def tensor(self, cpu: Any, index: int = 0) -> Any:
        """Mark CPU tensor ``cpu`` as a CUDA tensor on ``cuda:index``; returns it."""
        self._on[id(cpu)] = (weakref.ref(cpu), index)
        return cpu

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
        with self._lock:
            source = self._shared[handle]()
        if source is None:
            raise AssertionError("fake: the shared tensor was freed before the receiver copied it")
        return self.tensor(source.detach().clone(), self._index(source) or 0)
