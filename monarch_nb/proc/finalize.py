"""What interpreter finalization does for user code, run when a proc is stopped.

A proc ends with ``os._exit`` or its own SIGTERM (it never unwinds through the
forkserver, and a normal interpreter exit would wait for actor threads still in user
code), so Python's own finalization never runs there. As in Monarch, whose procs
finalize when their mesh stops, a user relies on two of its effects: functions
registered with ``atexit`` run, and objects held by the user's modules' globals are
released (their ``__del__`` runs: a file is flushed and closed, a marker written).
:func:`finalize_user_code` does those two, bounded by the host agent's grace period,
which kills the proc if a handler hangs.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import sysconfig
import traceback
from types import ModuleType

_RUNTIME_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # monarch_nb itself


def _library_dirs() -> tuple[str, ...]:
    """The standard library's and installed packages' folders: their modules are not
    the user's (Python finalizes them too, but a proc about to die gains nothing)."""
    paths = sysconfig.get_paths()
    dirs = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(sorted(dirs | {os.path.realpath(_RUNTIME_DIR)}))


def user_modules(modules: dict[str, ModuleType] | None = None) -> list[ModuleType]:
    """The modules of ``modules`` (default ``sys.modules``) loaded from a file outside
    the standard library, installed packages and monarch_nb, latest imported first
    (the order Python clears modules in)."""
    libraries = _library_dirs()
    found = []
    for module in list((sys.modules if modules is None else modules).values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str):
            continue
        real = os.path.realpath(path)
        if not any(real == d or real.startswith(d + os.sep) for d in libraries):
            found.append(module)
    return found[::-1]


def finalize_user_code() -> None:
    """Run the ``atexit`` handlers (what one raises is printed, the rest still run),
    then drop the globals of the user's modules (:func:`user_modules`) and collect
    cycles, so that their objects' ``__del__`` run. Never raises."""
    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - the proc is ending either way
        traceback.print_exc()
    for module in user_modules():
        try:
            _clear_globals(vars(module))
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
    # What the forkserver preloaded (a user's module among it) is frozen there
    # (host.forkserver): the proc's last collection must see it too, or a cycle of it
    # with a __del__ would never be finalized.
    gc.unfreeze()
    gc.collect()


def _clear_globals(namespace: dict) -> None:
    """Set a module's globals to ``None`` (its dunder names kept, so that a ``__del__``
    running meanwhile still finds ``__name__``), as Python's module finalization does."""
    for name in list(namespace):
        if not (name.startswith("__") and name.endswith("__")):
            namespace[name] = None
