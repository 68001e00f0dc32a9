"""The output streams of a daemon (hub, host agent), which never fail it.

A retained cluster's hub and host agents write their notices to ``hub.log`` in the
cluster directory. When that disk is full, a write there raises ``OSError`` (ENOSPC),
and most notices are printed from error handlers or liveness loops: a notice that
raises there ends the loop it reports on (the log store's writer, the heartbeats) or
the reply to a request. So a daemon's ``sys.stdout`` and ``sys.stderr`` are wrapped
(:func:`install`): a notice that can't be written is dropped and counted, and the
next one is tried again (the disk may have been freed meanwhile). What the file's buffer still holds of a
failed write (at most its buffer's size) goes out with the next write that succeeds.
"""

from __future__ import annotations

import io
import sys
from typing import TextIO


class NeverRaising(io.TextIOBase):
    """A text stream over ``stream`` whose ``write`` and ``flush`` never raise
    ``OSError`` or ``ValueError`` (a closed stream): what could not be written is
    dropped; ``lost`` counts those writes."""

    def __init__(self, stream: TextIO):
        super().__init__()
        self.stream = stream
        self.lost = 0  # writes (usually one notice each) that could not be written

    def write(self, text: str) -> int:
        try:
            self.stream.write(text)
            if "\n" in text:  # line by line, as a daemon's stderr is: a notice is on disk before what follows
                self.stream.flush()
        except (OSError, ValueError):
            self.lost += 1
        return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except (OSError, ValueError):
            self.lost += 1

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        try:
            return self.stream.isatty()
        except (OSError, ValueError):
            return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")


def install() -> NeverRaising:
    """Wrap this process's ``sys.stdout`` and ``sys.stderr`` (a daemon's entry point
    calls it first); returns the stderr wrapper, whose ``lost`` the daemon reports."""
    if not isinstance(sys.stdout, NeverRaising):
        sys.stdout = NeverRaising(sys.stdout)
    if not isinstance(sys.stderr, NeverRaising):
        sys.stderr = NeverRaising(sys.stderr)
    return sys.stderr
