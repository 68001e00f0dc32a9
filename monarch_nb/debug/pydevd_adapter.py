"""debugpy and its vendored pydevd, behind one door: the only module that imports them.

A proc's debugger needs a few things debugpy's public API has no call for: pydevd
connected to one end of a socketpair (no port to listen on), waking a resumed thread
at once, untracing every thread while there is nothing to stop for, tracing them
again, stopping in a given frame. Each is a function here that names the internal it reaches into; ``tests/test_pydevd_adapter.py``
checks every one against the installed debugpy on the running Python (CI: 3.11 and
3.13).

Written against debugpy 1.8.22 (``SUPPORTED``: the range trusted). Outside it, a
one-time warning on stderr (the proc's log) and the safe fallback: the proc is never
untraced (breakpoints still work, an armed proc runs slower); the harmless reach-in
(wake-up) is still tried. A missing internal is reported once on
stderr, naming what stops working, and the caller gets the slow-but-correct path:
these functions never raise for a changed pydevd, and never stay silent about it.

Nothing here imports debugpy until a function needs it: the client side imports
``dap`` (which hides its threads through :func:`hide_thread`) without debugpy.
"""

from __future__ import annotations

import importlib
import os
import re
import socket
import sys
import threading
from typing import Any

from ..wire import interrupts

SUPPORTED = ((1, 8, 22), (1, 9, 0))  # debugpy versions trusted: [low, high)

CONSTANTS = "_pydevd_bundle.pydevd_constants"
# pydevd's sys.monitoring tracer (CPython 3.12+). debugpy 1.8.22 ships it as a
# top-level package; it used to live in _pydevd_bundle (the old name is tried second).
SYS_MONITORING = ("_pydevd_sys_monitoring.pydevd_sys_monitoring", "_pydevd_bundle.pydevd_sys_monitoring")

_reported: set[str] = set()
_report_lock = threading.Lock()


def report_once(key: str, message: str) -> bool:
    """Print ``monarch_nb: message`` on stderr the first time ``key`` is reported in
    this process; returns whether it printed."""
    with _report_lock:
        if key in _reported:
            return False
        _reported.add(key)
    print(f"monarch_nb: {message}", file=sys.stderr, flush=True)
    return True


# the version ---------------------------------------------------------------------------
def debugpy_version() -> tuple[int, ...] | None:
    """The installed debugpy's version as integers (``(1, 8, 22)``), ``None`` when it
    can't be read. Imports debugpy (raises ``ImportError`` without it)."""
    import debugpy

    match = re.match(r"(\d+)\.(\d+)\.(\d+)", str(getattr(debugpy, "__version__", "")))
    return tuple(int(part) for part in match.groups()) if match else None


def _version_text() -> str:
    try:
        import debugpy

        return str(getattr(debugpy, "__version__", "of unknown version"))
    except ImportError:
        return "(not installed)"


def supported() -> bool:
    """Is the installed debugpy in ``SUPPORTED``? Outside it, warns once (stderr)."""
    low, high = SUPPORTED
    version = debugpy_version()
    if version is not None and low <= version < high:
        return True
    report_once("version", f"debugpy {_version_text()} is outside the versions monarch_nb's debugger was "
                f"written for ({_span()}): breakpoints work, but an armed proc stays traced (slower); "
                f"install debugpy>={'.'.join(map(str, low))},<{'.'.join(map(str, high))} for full speed")
    return False


# reaching in ----------------------------------------------------------------------------
def _reach(modules: str | tuple[str, ...], name: str, consequence: str) -> Any:
    """``name`` from the first of ``modules`` that has it, or ``None`` after reporting
    once what is missing and ``consequence`` (what stops working)."""
    errors = []
    for module in (modules,) if isinstance(modules, str) else modules:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            errors.append(f"{type(e).__name__}: {e}")
    report_once(f"{modules}.{name}", f"debugpy {_version_text()} has no {name} in "
                f"{' or '.join((modules,) if isinstance(modules, str) else modules)} ({'; '.join(errors)}): "
                f"{consequence}")
    return None


def global_debugger():
    """pydevd's ``PyDB`` of this process (``get_global_debugger``), ``None`` before
    :func:`connect_private` or when pydevd changed (reported)."""
    get = _reach(CONSTANTS, "get_global_debugger", "the debugger's speed-ups are off")
    return get() if get is not None else None


def uses_sys_monitoring() -> bool:
    """Does pydevd trace with ``sys.monitoring`` (CPython 3.12+, unless
    ``PYDEVD_USE_SYS_MONITORING=0``) rather than trace functions
    (``PYDEVD_USE_SYS_MONITORING``)? When that can't be read, guesses from Python."""
    flag = _reach(CONSTANTS, "PYDEVD_USE_SYS_MONITORING", "guessing pydevd's tracer from the Python version")
    if flag is None:
        return sys.version_info >= (3, 12) and hasattr(sys, "monitoring")
    return bool(flag)


def _sys_monitoring(name: str, consequence: str):
    return _reach(SYS_MONITORING, name, consequence)


def monitoring_tool() -> str | None:
    """The tool holding ``sys.monitoring.DEBUGGER_ID`` (``"pydevd"`` while pydevd
    monitors), ``None`` when free or before Python 3.12."""
    monitoring = getattr(sys, "monitoring", None)
    return monitoring.get_tool(monitoring.DEBUGGER_ID) if monitoring is not None else None


# starting -------------------------------------------------------------------------------
def connect_private() -> socket.socket:
    """Start pydevd in this process, its DAP stream on one end of a ``socketpair``;
    returns the other end, for this proc's own DAP client. Nothing listens: no other
    process, of this user or another, can reach pydevd (``debugpy.listen`` kept a
    loopback TCP port open for the proc's life, and DAP has no authentication: any
    local user who connected ran code as the owner).

    debugpy has no call for this: pydevd's ``settrace(block_until_connected=True)``
    connects through ``pydevd.start_client(host, port)`` (from ``pydevd_comm``),
    which is replaced for the duration of the call by one that hands over the
    socketpair's end; ``debugpy.server`` sets pydevd's protocol to DAP as it imports.
    pydevd runs in process, no adapter subprocess. Call once per process (the
    caller's lock). Checks the version (:func:`supported`). Raises ``ImportError``
    without debugpy, ``RuntimeError`` when pydevd can't be started this way (a
    changed pydevd: nothing is left listening then either)."""
    # pydevd warns on stderr about frozen stdlib modules; our breakpoints are never in them.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    import debugpy
    import debugpy.server  # noqa: F401 - makes pydevd speak DAP (debugpy._vendored.force_pydevd)
    import pydevd

    supported()
    if global_debugger() is not None:
        raise RuntimeError("pydevd already runs in this process (debugpy.listen or pydevd.settrace was called), "
                           "outside monarch_nb's debugger")
    _keep_interrupts_out_of_suspends(pydevd)
    if not callable(getattr(pydevd, "start_client", None)):
        raise RuntimeError(f"debugpy {_version_text()}: pydevd has no start_client to hand its connection to; "
                           "install a debugpy in " + _span())
    ours, theirs = socket.socketpair()
    handed: list[socket.socket] = []

    def start_client(host, port):
        handed.append(theirs)
        return theirs

    hide = "DEBUGPY_TRACE_DEBUGPY" not in os.environ  # as debugpy's own listen()
    original = pydevd.start_client
    pydevd.start_client = start_client
    try:
        pydevd.settrace(host="monarch-nb-socketpair", port=0, suspend=False, patch_multiprocessing=False,
                        block_until_connected=True, wait_for_ready_to_run=False, notify_stdin=False,
                        trace_only_current_thread=False,
                        dont_trace_start_patterns=(os.path.dirname(os.path.abspath(debugpy.__file__)),) if hide
                        else (),
                        dont_trace_end_patterns=("debugpy_launcher.py",) if hide else ())
    except BaseException:
        ours.close()
        theirs.close()
        raise
    finally:
        pydevd.start_client = original
    if not handed:
        ours.close()
        theirs.close()
        raise RuntimeError(f"debugpy {_version_text()}: pydevd did not connect through start_client; "
                           "install a debugpy in " + _span())
    return ours


def _keep_interrupts_out_of_suspends(pydevd) -> None:
    """Mark pydevd's suspend loop as code where an interrupt is dropped
    (``wire.interrupts.refusing``): a Ctrl-C or ``procs.interrupt()`` aimed at a rank
    paused at a breakpoint ended its wait there without pydevd knowing, so the rank was
    still listed as paused (``where`` showed nothing, ``eval`` failed, an async actor
    stayed wedged); deferred instead, it landed in pydevd's own code as the rank was
    continued, and the rank hung. It stays paused until it is continued, then runs on."""
    for name in ("do_wait_suspend", "_do_wait_suspend"):
        function = getattr(pydevd.PyDB, name, None)
        if callable(function) and hasattr(function, "__code__"):  # (pydevd changed if not: nothing is marked)
            interrupts.refusing(function)


def _span() -> str:
    low, high = SUPPORTED
    return f"{'.'.join(map(str, low))} to before {'.'.join(map(str, high))}"


def hide_thread(thread: threading.Thread) -> None:
    """Before ``thread.start()``: pydevd neither traces nor suspends it, nor lists it
    to IDEs (the thread attributes ``pydev_do_not_trace`` and ``is_pydev_daemon_thread``
    that pydevd reads; plain attributes, harmless without debugpy)."""
    thread.pydev_do_not_trace = True
    thread.is_pydev_daemon_thread = True


# speed-ups --------------------------------------------------------------------------------
def dap_socket() -> socket.socket | None:
    """pydevd's side of the DAP connection (``PyDB.writer.sock``: after
    :func:`connect_private`, the socketpair's other end), ``None`` before it connected
    or when pydevd changed (reported)."""
    py_db = global_debugger()
    writer = getattr(py_db, "writer", None)
    sock = getattr(writer, "sock", None)
    if py_db is not None and not hasattr(py_db, "writer"):
        report_once("PyDB.writer", f"debugpy {_version_text()}: PyDB has no writer: its DAP socket "
                    "can't be found")
    return sock if isinstance(sock, socket.socket) else None


def wake(thread_ident: int | None) -> bool:
    """Make a thread that debugpy was just told to resume (continue, step) run now.

    pydevd resumes a thread by changing its state; the thread, waiting in its suspend
    loop, only looks again when its wait times out (``TIMEOUT_SLOW``, 0.2 s), so every
    continue and step took up to 200 ms. Setting the thread's notify event
    (``PyDB.get_internal_queue_and_event(get_thread_id(thread))``) wakes it at once.
    Returns False (resuming merely slow) for an unknown thread or a changed pydevd."""
    thread = next((t for t in threading.enumerate() if t.ident == thread_ident), None)
    if thread is None:
        return False
    get_thread_id = _reach(CONSTANTS, "get_thread_id", "continue and step take up to 0.2 s")
    py_db = global_debugger()
    if get_thread_id is None or py_db is None:
        return False
    try:
        _, event = py_db.get_internal_queue_and_event(get_thread_id(thread))
        event.set()
    except (AttributeError, KeyError, TypeError) as e:
        report_once("wake", f"debugpy {_version_text()}: can't wake a resumed thread ({type(e).__name__}: {e}): "
                    "continue and step take up to 0.2 s")
        return False
    return True


# tracing ----------------------------------------------------------------------------------
def untrace_all() -> bool:
    """Stop tracing every thread of this process, so that an armed proc with nothing to
    stop for runs at full speed (on CPython 3.11 any trace function turns off the
    specialising interpreter: a pure-Python loop runs ~2.5x slower even when debugpy
    never stops in it). debugpy stays connected; :func:`retrace_all` (a breakpoint
    set) and :func:`stop_here` (its own thread) turn tracing back on.

    debugpy has no call for this: with ``sys.monitoring`` (3.12+) it is pydevd's
    ``stop_monitoring(all_threads=True)``, which frees ``sys.monitoring.DEBUGGER_ID``;
    with trace functions, ``threading.settrace_all_threads(None)`` (3.12+) or the C
    API's ``_PyEval_SetTrace`` on each thread state (CPython 3.10/3.11). Returns False,
    the proc staying traced (slower, still correct), outside ``SUPPORTED`` or where
    none applies (reported once)."""
    if not supported():
        return False
    if uses_sys_monitoring():
        stop = _sys_monitoring("stop_monitoring", "an armed proc stays monitored (slower)")
        if stop is None:
            return False
        stop(all_threads=True)
        if monitoring_tool() is not None:
            report_once("stop_monitoring", f"pydevd's stop_monitoring left sys.monitoring's debugger id to "
                        f"{monitoring_tool()!r}: an armed proc stays monitored (slower)")
            return False
        return True
    if hasattr(threading, "settrace_all_threads"):
        threading.settrace_all_threads(None)
        return True
    return _untrace_thread_states()


def _untrace_thread_states() -> bool:
    import ctypes

    api = ctypes.pythonapi
    if sys.implementation.name != "cpython" or not hasattr(api, "_PyEval_SetTrace"):
        report_once("_PyEval_SetTrace", f"{sys.implementation.name} {sys.version.split()[0]} has no "
                    "_PyEval_SetTrace: an armed proc stays traced (slower)")
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


def retrace_all() -> bool:
    """Undo :func:`untrace_all`: debugpy traces (monitors) every thread again, before
    breakpoints are set, which it only checks in traced threads (``PyDB.patch_threads``,
    ``enable_tracing(trace_dispatch, apply_to_all_threads=True)``,
    ``set_tracing_for_untraced_contexts``). Returns False when pydevd changed
    (reported: breakpoints may then be missed in threads already running)."""
    py_db = global_debugger()
    if py_db is None:
        return False
    try:
        py_db.patch_threads()
        py_db.enable_tracing(py_db.trace_dispatch, apply_to_all_threads=True)
        py_db.set_tracing_for_untraced_contexts()
    except (AttributeError, TypeError) as e:
        report_once("retrace", f"debugpy {_version_text()}: can't trace every thread again "
                    f"({type(e).__name__}: {e}): breakpoints may be missed in running threads")
        return False
    return True


def stop_here(frame) -> None:
    """Suspend the calling thread in ``frame`` under the armed debugger (returns when
    the thread is continued). The stop is at ``frame``'s next line, as with pdb
    (``pydevd.settrace(stop_at_frame=frame)``). After :func:`untrace_all` freed
    ``sys.monitoring``'s debugger id, pydevd takes it back itself as it traces ``frame``
    (``_ensure_monitoring``)."""
    import pydevd

    pydevd.settrace(suspend=True, trace_only_current_thread=True, patch_multiprocessing=False,
                    stop_at_frame=frame, notify_stdin=False)


def post_mortem(exc: BaseException) -> None:
    """Suspend the calling thread in the innermost user frame of ``exc``'s traceback
    (the frames are unwound: locals are there, stepping is not), through debugpy's
    ``trigger_exception_handler``. Without it (reported), the error just goes back."""
    import debugpy

    trigger = getattr(debugpy, "trigger_exception_handler", None)
    if trigger is None:
        report_once("trigger_exception_handler", f"debugpy {_version_text()} has no trigger_exception_handler: "
                    "post-mortem does not pause; upgrade debugpy")
        return
    trigger((type(exc), exc, exc.__traceback__), as_uncaught=False)
