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
                    on_orphan: Callable[[], None] | None = None, poll_s: float = 0.2,
                    watchdog: bool = True) -> None:
    """Receive ``sig`` when the parent exits; exit at once if it already has.

    ``on_orphan`` (default: ``os._exit(1)``) runs on the watchdog thread when the
    parent is found gone by polling; ``watchdog=False``: no such thread (a process
    that forks must have none), the kernel's signal only.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except OSError:
            pass
    if os.getppid() != expected_ppid:  # parent died before prctl took effect
        os._exit(1)
    if not watchdog:
        return

    def watch() -> None:
        while os.getppid() == expected_ppid:
            time.sleep(poll_s)
        (on_orphan or (lambda: os._exit(1)))()

    threading.Thread(target=watch, name="monarch-nb-lifeline", daemon=True).start()
