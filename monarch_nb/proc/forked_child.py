"""A child that an actor's code forks (``os.fork()``, a DataLoader's worker) is not that
actor: it must never reply, report a failure or read the actor's inbox for it.

The child inherits the actor's thread (the only one it has) in the middle of the
actor's code. When it leaves that code, back into the runtime (by ``sys.exit``, an
exception or a plain return), it exits there as a process started by
``multiprocessing`` would: ``SystemExit``'s code (``None``: 0; not an int: printed, 1),
1 with the traceback printed for any other exception, 0 for a return, its output
flushed first and no exit handlers run (they are the parent's: ``os._exit``).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import NoReturn

from . import stdio

# Forks this process went through: an actor made before the latest one belongs to the
# parent, and its thread here is the copy a forked child inherited. Counted by an
# at-fork hook rather than comparing os.getpid(), a system call per call of the actor.
_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)


def lineage() -> int:
    """This process's forks so far: an actor records it when made (``is_child``)."""
    return _forks


def is_child(recorded: int) -> bool:
    """Whether this process is a child forked since ``lineage()`` gave ``recorded``."""
    return _forks != recorded


def exit_code(error: BaseException | None) -> int:
    """The status a child leaving with ``error`` (``None``: it returned) exits with,
    after printing what Python would print for it on ``sys.stderr``."""
    if error is None or isinstance(error, StopIteration):  # StopIteration: a coroutine's return
        return 0
    if isinstance(error, SystemExit):
        if error.code is None:
            return 0
        if isinstance(error.code, int):
            return error.code
        print(error.code, file=sys.stderr)
        return 1
    traceback.print_exception(error)
    return 1


def leave(error: BaseException | None, where: str, suspended: bool = False) -> NoReturn:
    """End this forked child, which left the actor code of ``where`` (``mesh rank``)
    with ``error`` (``None``: it returned; ``suspended``: an async endpoint's coroutine
    awaited, which would hand the child to a copy of the parent's event loop). Never
    returns."""
    code = 1  # if even working out the status fails
    try:
        if suspended:
            print(f"monarch_nb: a process forked by actor {where} awaited in the actor's event loop, "
                  "which belongs to its parent; it exits. A forked child must finish with sys.exit() "
                  "or os._exit() before awaiting.", file=sys.stderr)
        else:
            code = exit_code(error)
        stdio.flush_all()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass  # closed or replaced by the user's code: nothing more to write
    finally:
        os._exit(code)
