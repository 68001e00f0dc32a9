"""Actors for tests/test_interrupts.py (importable by procs through sys.path)."""

from __future__ import annotations

import threading
import time

from monarch_nb.actor import Actor, endpoint
from monarch_nb.wire import frames


REBUILD_STEPS = 300  # Python steps to unpickle one Noted (a tensor's _rebuild_tensor_v2 runs some too)


class Noted(int):
    """An int whose unpickling runs Python code, as a tensor's does: an interrupt can
    land while a reply holding one is unpickled."""

    def __reduce__(self):
        return _rebuild_noted, (int(self),)


def _rebuild_noted(i: int) -> "Noted":
    for _ in range(REBUILD_STEPS):
        pass
    return Noted(i)


class Recorder(Actor):
    """Records the id of every call it runs, so a test can tell lost and doubled calls."""

    def __init__(self):
        self.ids: list[int] = []

    @endpoint
    def note(self, i: int, rich: bool = False) -> int:
        """``i`` (``rich``: as a :class:`Noted`, whose unpickling runs Python code)."""
        self.ids.append(i)
        return Noted(i) if rich else i

    @endpoint
    def busy(self, i: int, seconds: float) -> int:
        """Python work (interruptible at any bytecode) for ``seconds``."""
        self.ids.append(i)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            sum(range(100))
        return i

    @endpoint
    def seen(self) -> list[int]:
        return list(self.ids)

    @endpoint
    def dropped(self) -> int:
        return frames.dropped()

    @endpoint
    def alive(self) -> list[str]:
        return sorted(t.name for t in threading.enumerate() if t.name.startswith("actor-"))
