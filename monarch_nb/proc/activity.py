"""What the actors of this proc are doing, for the health tree.

Each actor thread says which endpoint it runs and since when; the debugger marks the
threads it holds paused (with where they stopped). The proc's control loop reads
both when the hub asks for ``status``.
"""

from __future__ import annotations

import threading
import time

_lock = threading.Lock()
_paused: dict[int, dict] = {}  # thread ident -> what the debugger says about the stop


def set_paused(thread_ident: int, info: dict | None) -> None:
    """Mark the thread ``thread_ident`` paused (``info``: file, line, function, ...) or,
    with ``None``, running again."""
    with _lock:
        if info is None:
            _paused.pop(thread_ident, None)
        else:
            _paused[thread_ident] = {**info, "since": time.time()}


def paused(thread_ident: int | None) -> dict | None:
    with _lock:
        return _paused.get(thread_ident)
