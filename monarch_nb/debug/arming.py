"""Starting debugpy inside a proc: once, on loopback, without restarting the proc.

debugpy runs *in process* (``in_process_debug_adapter=True``): pydevd itself speaks
DAP on a 127.0.0.1 port, no adapter subprocess. The only client on that port is the
proc's own session (``session.ProcDebugger``); IDEs share it through ``mux``.
"""

from __future__ import annotations

import linecache
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


def wake(thread_ident: int | None) -> bool:
    """Make a thread that debugpy was just told to resume (continue, step) run now.

    pydevd resumes a thread by changing its state; the thread, waiting in its suspend
    loop, only looks again when its wait times out (``TIMEOUT_SLOW``, 0.2 s), so every
    continue and step took up to 200 ms. Setting the thread's notify event wakes it at
    once. Fragile like :func:`fix_nodelay` (pydevd internals: ``get_thread_id``,
    ``PyDB.get_internal_queue_and_event``); without them, resuming is merely slow."""
    import threading

    thread = next((t for t in threading.enumerate() if t.ident == thread_ident), None)
    if thread is None:
        return False
    try:
        from _pydevd_bundle.pydevd_constants import get_global_debugger, get_thread_id

        _, event = get_global_debugger().get_internal_queue_and_event(get_thread_id(thread))
    except (ImportError, AttributeError, KeyError, TypeError):
        return False
    event.set()
    return True


def untrace_all() -> bool:
    """Stop tracing every thread of this process, so that an armed proc with nothing to
    stop for runs at full speed (on CPython 3.11 any trace function turns off the
    specialising interpreter: a pure-Python loop runs ~2.5x slower even when debugpy
    never stops in it). debugpy stays connected; :func:`retrace_all` (a breakpoint
    set) and ``breakpoint()`` (its own thread) turn tracing back on.

    debugpy has no call for this: with ``sys.monitoring`` (3.12+) it is pydevd's
    ``stop_monitoring``; before, the C API's ``_PyEval_SetTrace`` on each thread state
    (CPython 3.10/3.11 export it). Returns False where neither applies."""
    import ctypes
    import threading

    from _pydevd_bundle.pydevd_constants import PYDEVD_USE_SYS_MONITORING

    if PYDEVD_USE_SYS_MONITORING:
        from _pydevd_bundle import pydevd_sys_monitoring

        pydevd_sys_monitoring.stop_monitoring(all_threads=True)
        return True
    api = ctypes.pythonapi
    if sys.implementation.name != "cpython" or not hasattr(api, "_PyEval_SetTrace"):
        return False
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
    api.PyThreadState_Next.restype = ctypes.c_void_p
    api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
    api._PyEval_SetTrace.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    threading.settrace(None)  # threads started from now on
    state = api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Get())
    while state:  # the GIL is held throughout (ctypes.pythonapi does not release it)
        api._PyEval_SetTrace(state, None, None)
        state = api.PyThreadState_Next(state)
    return True


def retrace_all() -> None:
    """Undo :func:`untrace_all`: debugpy traces every thread again (before setting
    breakpoints, which it only checks in traced threads)."""
    from _pydevd_bundle.pydevd_constants import get_global_debugger

    py_db = get_global_debugger()
    py_db.patch_threads()
    py_db.enable_tracing(py_db.trace_dispatch, apply_to_all_threads=True)
    py_db.set_tracing_for_untraced_contexts()


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
