"""Keeping ``KeyboardInterrupt`` out of the runtime's critical sections.

Ctrl-C in a notebook or a script raises ``KeyboardInterrupt`` on the main thread at
whatever bytecode it happens to be running. Landing between two frames of a multipart
send tears the message (the next one on that socket is appended to it); landing inside
``threading.Condition.wait`` leaves its lock half released ("cannot release un-acquired
lock"); landing between sending a call and registering its reply port loses the reply.

As trio does (``trio/_core/_ki.py``), the runtime marks its code instead of trying to
be correct at every bytecode:

- :func:`protected` marks a function whose frames must not be interrupted: the sends,
  the reply dispatch, the port and lock bookkeeping. Code it calls (a done-callback,
  say) is protected too.
- :func:`checkpoint` marks a function where an interrupt may land although a protected
  caller is on the stack: the blocking waits (a zmq poll, a waiter's lock), which leave
  nothing half done when interrupted. Code it calls is interruptible.

:func:`allows` walks a stack from the innermost frame out; the first marked frame
decides, unmarked stacks (user code) are interruptible. On the main thread, SIGINT's
handler (installed by :func:`guard_main_thread` over Python's default one) defers an
interrupt that arrives inside protected code: it is re-delivered every
``REDELIVER_S`` seconds until it lands outside, so it is late by at most the length of
the critical section and is never lost or doubled. A proc applies the same marks to
interrupts aimed at its actor threads (``proc.actor_loop``).

Marks cost nothing at run time: they are looked up only when an interrupt arrives.

A SIGINT handler of the user's own (installed after the runtime's) raises wherever the
interpreter runs signal handlers, marks or not. ``with lock:`` blocks stay whole under
it only if no loop runs directly in them: on Python 3.12+ the compiler may leave a
loop's back-edge (where handlers run) outside the block's exception handler
(python/cpython#130279), and a ``KeyboardInterrupt`` raised there skips ``__exit__``,
leaving the lock held. So the loops under a lock, in every layer whose code a Ctrl-C
or a proc's interrupt lands in (``INTERRUPTED_LAYERS`` in ``tests/test_interrupts.py``,
which checks it), are in a function of their own, called from the block.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal.py's C half: no stubs
import _thread
import os
import signal
import threading
import time
import types
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)

REDELIVER_S = 0.002  # how soon a deferred interrupt is tried again (seconds)

_marks: dict[types.CodeType, bool] = {}  # code -> True: protected, False: checkpoint
_refusing: set[types.CodeType] = set()  # code where an interrupt is dropped (refusing)
_main_ident = threading.main_thread().ident


def protected(fn: F) -> F:
    """Mark ``fn``: an interrupt arriving while it (or anything it calls) runs waits
    until it has returned."""
    _marks[fn.__code__] = True
    return fn


def refusing(fn: F) -> F:
    """Mark ``fn``: an interrupt aimed at a thread running it (or anything it calls) is
    dropped, neither landing nor deferred (a thread paused in the debugger: an interrupt
    ended its wait behind the debugger's back, and one deferred until it runs again
    landed in the debugger's own code on its way back)."""
    _refusing.add(fn.__code__)
    return fn


def refuses(frame: types.FrameType | None) -> bool:
    """Whether an interrupt aimed at the stack of ``frame`` is to be dropped (:func:`refusing`)."""
    while frame is not None:
        if frame.f_code in _refusing:
            return True
        frame = frame.f_back
    return False


def checkpoint(fn: F) -> F:
    """Mark ``fn`` as a place where an interrupt may land even under protected callers:
    it blocks, and being interrupted leaves nothing half done."""
    _marks[fn.__code__] = False
    return fn


@checkpoint
def sleep_on(waiter: "_thread.LockType", seconds: float) -> None:
    """Block until ``waiter`` (a lock the caller holds, private to this wait) is
    released by whoever wakes the caller, or ``seconds`` pass. A bare lock's acquire is
    either interrupted before it takes the lock or not at all, so Ctrl-C here leaves
    only that private lock behind (unlike ``Condition.wait``, whose bookkeeping an
    interrupt can tear)."""
    waiter.acquire(True, seconds)


def allows(frame: types.FrameType | None) -> bool:
    """Whether an interrupt may land in ``frame`` (and the stack it was called from)."""
    while frame is not None:
        mark = _marks.get(frame.f_code)
        if mark is not None:
            return not mark
        frame = frame.f_back
    return True


# main thread: a SIGINT handler that defers ------------------------------------------
# The handler takes no lock (it may run inside any lock's acquire, its own included):
# it wakes the re-delivering thread through a pipe.
_pending = False  # an interrupt arrived in protected code and waits to be delivered
_wake_r, _wake_w = -1, -1
_redeliverer: threading.Thread | None = None


@protected
def _on_sigint(signum, frame) -> None:
    global _pending
    if not allows(frame):
        if not _pending:
            _pending = True
            try:
                os.write(_wake_w, b"!")
            except OSError:  # full (it is already awake) or closed
                pass
        return
    _pending = False
    raise KeyboardInterrupt


def _redeliver() -> None:
    global _pending
    while True:
        os.read(_wake_r, 4096)
        while True:
            time.sleep(REDELIVER_S)
            if not _pending:
                break
            if signal.getsignal(signal.SIGINT) is not _on_sigint:
                _pending = False  # replaced (e.g. the kernel's cell ended): that Ctrl-C is over
                break
            _thread.interrupt_main(signal.SIGINT)  # runs _on_sigint again on the main thread


def _start_redeliverer() -> None:
    global _redeliverer, _wake_r, _wake_w
    if _redeliverer is None or _wake_pid != os.getpid():
        _set_pid()
        _wake_r, _wake_w = os.pipe()
        os.set_blocking(_wake_w, False)
        redeliverer = threading.Thread(target=_redeliver, name="monarch-nb-interrupts", daemon=True)
        try:
            redeliverer.start()
        except RuntimeError:  # at interpreter shutdown (3.12+: no new thread; an atexit stop): no Ctrl-C left to defer
            return
        _redeliverer = redeliverer


_wake_pid = -1
_SIGINT = int(signal.SIGINT)


def _set_pid() -> None:
    global _wake_pid
    _wake_pid = os.getpid()


def guard_main_thread() -> None:
    """On the main thread, put the deferring handler in place of Python's default
    SIGINT handler (``signal.default_int_handler``, which ipykernel also sets for each
    cell). A handler of the user's own is left alone. Cheap: call it before every
    critical section that may run on the main thread."""
    if threading.get_ident() != _main_ident:
        return
    # _signal's getsignal: signal.getsignal wraps the answer in an enum by raising and
    # catching a ValueError, which costs more than the rest of a small call's send.
    if _signal.getsignal(_SIGINT) is signal.default_int_handler:
        _start_redeliverer()
        try:
            signal.signal(signal.SIGINT, _on_sigint)
        except ValueError:  # not the main interpreter
            pass


def deferred() -> bool:
    """Whether a Ctrl-C is waiting for the main thread to leave protected code."""
    return _pending
