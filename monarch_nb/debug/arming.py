"""Starting debugpy inside a proc: once, without restarting the proc, reachable by no
other process.

pydevd runs *in process* (no adapter subprocess) and speaks DAP over one end of a
socketpair whose other end is the proc's own session (``session.ProcDebugger``,
through ``pydevd_adapter.connect_private``): no port, so no local user can connect to
it. IDEs share that session through ``mux``. Every call into debugpy or pydevd goes
through ``pydevd_adapter``; what is here needs neither.
"""

from __future__ import annotations

import linecache
import os
import sys
from pathlib import Path
from typing import Callable

RUNTIME_DIR = str(Path(__file__).resolve().parent.parent)  # monarch_nb/: never shown or stepped into


def materialize(path: str, source: str) -> None:
    """Write a notebook cell's ``source`` at its file name ``path`` (e.g.
    ``/tmp/ipykernel_123/4567.py``) unless a file is there: debugpy sets breakpoints
    only in files that exist, and tracebacks and ``where`` then show its lines. The
    name is a hash of the text, so a file already there holds the same cell."""
    if path.startswith("<") or os.path.exists(path):
        return
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    except OSError as e:
        print(f"monarch_nb: can't write {path} for its breakpoints: {e}", file=sys.stderr, flush=True)
    linecache.checkcache(path)


def install_hook(hook: Callable) -> None:
    """Make ``breakpoint()`` call ``hook``. pydevd installs its own hook when imported
    (one that does nothing useful without its client), so this runs again after
    arming."""
    sys.breakpointhook = hook
