"""Actors whose proc leaves marks when it is finalized (tests/test_proc_finalizers.py):
a module global with ``__del__`` and an ``atexit`` handler."""

from __future__ import annotations

import atexit
import os

from monarch_nb.actor import Actor, endpoint


class _Marker:
    """Writes ``text`` to ``path`` when released."""

    def __init__(self, path: str, text: str):
        self._file = open(path, "w")  # opened now: at finalization, open() may be gone
        self._text = text

    def __del__(self) -> None:
        self._file.write(self._text)
        self._file.close()


_held: _Marker | None = None  # only a proc's finalization releases it


class LeavesMarks(Actor):
    def __init__(self, folder: str):
        global _held
        _held = _Marker(os.path.join(folder, f"del-{os.getpid()}"), "finalized")
        marker = os.path.join(folder, f"atexit-{os.getpid()}")
        atexit.register(lambda: open(marker, "w").write("ran"))

    @endpoint
    def pid(self) -> int:
        return os.getpid()
