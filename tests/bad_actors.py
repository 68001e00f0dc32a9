"""Actors for tests/test_bad_messages.py (importable by procs through sys.path)."""

from __future__ import annotations

import sys

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
