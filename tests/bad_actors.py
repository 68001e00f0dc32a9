"""Actors for tests/test_bad_messages.py (importable by procs through sys.path)."""

from __future__ import annotations

import sys
import threading
import time

from monarch_nb.actor import Actor, endpoint
from monarch_nb.wire import frames


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str for you")


class ExitsWhenUnpickled:
    """Unpickling it raises SystemExit (in whoever unpickles it)."""

    def __reduce__(self):
        return (sys.exit, (3,))


class Target(Actor):
    def __init__(self):
        self.notes: list = []

    @endpoint
    def note(self, x):
        self.notes.append(x)
        return x

    @endpoint
    def notes_seen(self) -> list:
        return list(self.notes)

    @endpoint
    def raise_unprintable(self):
        raise Unprintable()

    @endpoint
    def return_exiting(self):
        return ExitsWhenUnpickled()

    @endpoint
    def dropped(self) -> int:
        return frames.dropped()


class Busy(Actor):
    """Endpoints that keep their actor busy: interruptible Python work, or a blocking
    call that an interrupt can't end."""

    @endpoint
    def spin(self, seconds: float) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            sum(range(100))
        return "done"

    @endpoint
    def stubborn(self, seconds: float) -> str:
        time.sleep(seconds)  # one blocking C call: an interrupt lands only after it
        return "done"

    @endpoint
    def actor_threads(self) -> list[str]:
        return sorted(t.name for t in threading.enumerate() if t.name.startswith("actor-"))


class SlowInit(Actor):
    """An ``__init__`` that does not return for ``seconds`` (interruptible Python work)."""

    def __init__(self, seconds: float):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            sum(range(100))
