"""Tie a process's life to its parent's, so nothing outlives the process that made it.

On Linux the kernel delivers a signal when the parent dies (``PR_SET_PDEATHSIG``);
everywhere a watchdog thread also polls ``getppid()`` as a fallback.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import Callable

_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_ppid: int, sig: int = signal.SIGKILL,
                    on_orphan: Callable[[], None] | None = None, poll_s: float = 0.2) -> None:
    """Receive ``sig`` when the parent exits; exit at once if it already has.

    ``on_orphan`` (default: ``os._exit(1)``) runs on the watchdog thread when the
    parent is found gone by polling.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except OSError:
            pass
    if os.getppid() != expected_ppid:  # parent died before prctl took effect
        os._exit(1)
    watch_pid(expected_ppid, on_orphan or (lambda: os._exit(1)), poll_s, parent=True)


def watch_pid(pid: int, on_gone: Callable[[], None], poll_s: float = 0.2, parent: bool = False) -> None:
    """Call ``on_gone`` (once, on a daemon thread) when process ``pid`` no longer exists
    (or, with ``parent=True``, is no longer this process's parent)."""

    def alive() -> bool:
        if parent:
            return os.getppid() == pid
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def watch() -> None:
        while alive():
            time.sleep(poll_s)
        on_gone()

    threading.Thread(target=watch, name=f"monarch-nb-watch-{pid}", daemon=True).start()
