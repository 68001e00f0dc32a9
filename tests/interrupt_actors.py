"""Actors for tests/test_interrupts.py (importable by procs through sys.path)."""

from __future__ import annotations

import threading
import time

from monarch_nb.actor import Actor, endpoint
from monarch_nb.wire import frames


class Recorder(Actor):
    """Records the id of every call it runs, so a test can tell lost and doubled calls."""

    def __init__(self):
        self.ids: list[int] = []

    @endpoint
    def note(self, i: int) -> int:
        self.ids.append(i)
        return i

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
