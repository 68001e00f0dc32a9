"""Actor lines land between the cell's own lines, never inside one.

``print("a", "b")`` writes ``a``, `` ``, ``b`` and a newline as four ``write`` calls; the
log receiver thread writing an actor line in between (to the same output area) split the
cell's line in two (268 of 600 lines in one run). The gate wraps the kernel's
``sys.stdout``/``sys.stderr`` ``write`` to know, per stream, whether the cell's own
output stands at a line's start; an actor line for the running cell that comes mid-line
is held, and written by the cell's own thread right after it ends the line (``\\n`` or
``\\r``). A line held longer than ``HOLD_S`` (a cell that leaves a line open: a spinner)
is written anyway, on a line of its own; :meth:`LineGate.release` writes what is held
(the cell's end).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

HOLD_S = 1.0


class _Stream:
    """One wrapped stream: its original ``write`` and whether its own output is mid-line."""

    def __init__(self, stream):
        self.stream = stream
        self.write = stream.write  # the original bound method: actor lines use it
        self.mid_line = False
        self.held: list[tuple[float, Callable[[Callable[[str], object]], None]]] = []


class LineGate:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.RLock()  # a held line's writer may write through the gate again
        self._streams: dict[int, _Stream] = {}

    def install(self, stream) -> None:
        """Watch ``stream``'s own writes (an instance attribute shadows its ``write``)."""
        if id(stream) in self._streams:
            return
        wrapped = self._streams[id(stream)] = _Stream(stream)

        def write(text: str):
            with self._lock:
                result = wrapped.write(text)
                if text:
                    wrapped.mid_line = not text.endswith(("\n", "\r"))
                    self._write_held(wrapped, force=False)
                return result

        try:
            stream.write = write
        except (AttributeError, TypeError):  # a stream that takes no attributes: not gated
            del self._streams[id(stream)]

    def uninstall(self) -> None:
        """Restore every stream's own ``write`` (after writing what is held)."""
        with self._lock:
            for wrapped in self._streams.values():
                self._write_held(wrapped, force=True)
                try:
                    del wrapped.stream.write
                except AttributeError:
                    pass
            self._streams.clear()

    def write(self, stream, writer: Callable[[Callable[[str], object]], None], hold: bool) -> None:
        """Run ``writer(write)`` now, with ``write`` the stream's original one, or (``hold``:
        the line belongs where the cell's own output is going) once the cell's own output
        on ``stream`` stands at a line's start."""
        wrapped = self._streams.get(id(stream))
        if wrapped is None:
            writer(stream.write)
            return
        with self._lock:
            if hold and (wrapped.mid_line or wrapped.held):
                wrapped.held.append((self._clock(), writer))
                self._write_held(wrapped, force=False)
            else:
                writer(wrapped.write)

    def release(self) -> None:
        """Write every held line now (the cell ended), each on a line of its own."""
        with self._lock:
            for wrapped in self._streams.values():
                self._write_held(wrapped, force=True)

    def _write_held(self, wrapped: _Stream, force: bool) -> None:
        """Caller holds the lock."""
        if not wrapped.held:
            return
        overdue = self._clock() - wrapped.held[0][0] > HOLD_S
        if wrapped.mid_line and not (force or overdue):
            return
        held, wrapped.held = wrapped.held, []
        if wrapped.mid_line:
            wrapped.write("\n")  # the cell left its line open: ours go below it
            wrapped.mid_line = False
        for _, writer in held:
            writer(wrapped.write)
