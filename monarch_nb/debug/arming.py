"""Starting debugpy inside a proc: once, on loopback, without restarting the proc.

debugpy runs *in process* (``in_process_debug_adapter=True``): pydevd itself speaks
DAP on a 127.0.0.1 port, no adapter subprocess. The only client on that port is the
proc's own session (``session.ProcDebugger``); IDEs share it through ``mux``.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Callable

from .dap import no_delay

RUNTIME_DIR = str(Path(__file__).resolve().parent.parent)  # monarch_nb/: never shown or stepped into


def listen() -> tuple[str, int]:
    """``debugpy.listen`` on a free loopback port; returns ``(host, port)``. Call once
    per process (debugpy refuses a second call). Raises ``ImportError`` without debugpy."""
    # pydevd warns on stderr about frozen stdlib modules; our breakpoints are never in them.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    import debugpy

    return debugpy.listen(("127.0.0.1", 0), in_process_debug_adapter=True)


def fix_nodelay(timeout: float = 2.0) -> bool:
    """Set TCP_NODELAY on pydevd's side of the DAP connection.

    pydevd writes each message's header and body with two ``sendall`` calls; with
    Nagle's algorithm the body then waits for the client's delayed ACK, which costs
    ~44 ms per response on loopback. Fragile: it reaches into pydevd's internals
    (``get_global_debugger().writer.sock``, present since debugpy 1.0 and still in
    1.8); if they change, this returns False and requests are merely slow. Waits up
    to ``timeout`` seconds for pydevd to accept the connection."""
    try:
        from _pydevd_bundle.pydevd_constants import get_global_debugger
    except ImportError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock = getattr(getattr(get_global_debugger(), "writer", None), "sock", None)
        if isinstance(sock, socket.socket):
            try:
                no_delay(sock)
                return True
            except OSError:
                return False
        time.sleep(0.001)
    return False


def install_hook(hook: Callable) -> None:
    """Make ``breakpoint()`` call ``hook``. pydevd installs its own hook when imported
    (one that does nothing useful without its client), so this runs again after
    arming."""
    sys.breakpointhook = hook


def stop_here(frame) -> None:
    """Suspend the calling thread in ``frame`` under the armed debugger (returns when
    the thread is continued). The stop is at ``frame``'s next line, as with pdb."""
    import pydevd

    pydevd.settrace(suspend=True, trace_only_current_thread=True, patch_multiprocessing=False,
                    stop_at_frame=frame, notify_stdin=False)


def post_mortem(exc: BaseException) -> None:
    """Suspend the calling thread in the innermost user frame of ``exc``'s traceback
    (the frames are unwound: locals are there, stepping is not)."""
    import debugpy

    debugpy.trigger_exception_handler((type(exc), exc, exc.__traceback__), as_uncaught=False)
