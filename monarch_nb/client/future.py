"""``Future``: the result of an endpoint call, to ``get()`` or ``await``."""

from __future__ import annotations

import asyncio
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Generic, TypeVar

from ..wire.interrupts import protected
from . import progress

if TYPE_CHECKING:
    from .runtime import ClientRuntime

R = TypeVar("R")

# While the main thread's event loop awaits a call, it wakes this often (seconds) to run
# the Python signal handlers: SIGINT may be delivered to any thread, and Python runs its
# handler on the main thread only when that thread runs bytecode, which a loop blocked in
# its selector with nothing due does not. ipykernel's handler for a cell with a top-level
# ``await`` (it cancels the cell) ran only once the call ended.
SIGNAL_TICK_S = 0.1


class _Ticker:
    """A callback every ``SIGNAL_TICK_S`` on ``loop`` until :meth:`cancel`."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._handle = loop.call_later(SIGNAL_TICK_S, self._tick)

    def _tick(self) -> None:
        self._handle = self._loop.call_later(SIGNAL_TICK_S, self._tick)

    def cancel(self) -> None:
        self._handle.cancel()


class Future(Generic[R]):
    """A value that arrives later from one or more actors.

    ``get()`` blocks the calling thread and drives the process's I/O itself, so it
    works in scripts, in threads and inside a notebook cell (whose asyncio loop it
    does not need). ``await future`` works on any running asyncio loop: a notebook's
    top level, an ``async def`` endpoint.
    """

    def __init__(self, runtime: "ClientRuntime", description: str = "call"):
        self._runtime = runtime
        self._mailbox = runtime.mailbox
        self._description = description
        self._lock = threading.Lock()
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[["Future"], None]] = []
        self._ranks = 1  # how many ranks answer this call, and how many have (for progress)
        self._answered: Callable[[], int] = lambda: int(self._done)
        self._why_slow: Callable[[], str] = lambda: ""  # appended to the TimeoutError (e.g. paused ranks)
        # Raised by a wait that could never end: the call goes to an actor waiting on this
        # caller (``proc.call_chain``).
        self._cycle: BaseException | None = None

    # completion (called from the thread dispatching replies) ---------------------------
    @protected
    def _resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        with self._lock:
            if self._done:
                return
            self._value, self._error, self._done = value, error, True
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            self._run_callback(cb)

    def _run_callback(self, cb: Callable[["Future"], None]) -> None:
        # One that raises is reported and the others still run (an ``await`` of this
        # future waits on one of them), as concurrent.futures does.
        try:
            cb(self)
        except Exception:  # noqa: BLE001 - the user's callback: reported, not raised into the dispatch
            print(f"monarch_nb: a done-callback of {self._description} raised:\n{traceback.format_exc()}",
                  file=sys.stderr, end="")

    # public ----------------------------------------------------------------------------
    def done(self) -> bool:
        """True once the value (or the error) has arrived; never blocks."""
        return self._done

    def get(self, timeout: float | None = None) -> R:
        """The value, waiting up to ``timeout`` seconds (``None``: no limit).

        Raises the call's error (e.g. :class:`~monarch_nb.errors.ActorError`), or
        ``TimeoutError`` when nothing arrived in time (the call keeps running and a
        later ``get()`` may still succeed), or, at once,
        :class:`~monarch_nb.errors.CallCycleError` inside an endpoint whose actor the
        call waits on (a call to its own actor, or around a cycle).
        """
        if not self._done:
            if self._cycle is not None:
                raise self._cycle
            # Waited on by the main thread (a cell): what its Ctrl-C interrupts (client.in_flight).
            # A KeyboardInterrupt leaves the mark for the cell's handler; the call's end clears it.
            waited = self._runtime.in_flight.waited if threading.current_thread() is threading.main_thread() else None
            if waited is not None:
                waited.add(id(self))
            arrived = progress.wait(self._mailbox, self._runtime.bar_factory, lambda: self._done, timeout,
                                    self._description, self._ranks, self._answered)
            if waited is not None:
                waited.discard(id(self))
            if not arrived:
                raise TimeoutError(f"{self._description} did not finish within {timeout} s{self._why_slow()}")
        if self._error is not None:
            raise self._error
        return self._value

    result = get  # Monarch's and concurrent.futures' name

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The call's error, or None if it succeeded; waits like :meth:`get`."""
        try:
            self.get(timeout)
        except TimeoutError:
            if not self._done:
                raise
        except BaseException:  # noqa: BLE001 - reported, not raised
            pass
        return self._error

    @protected
    def add_done_callback(self, fn: Callable[["Future"], None]) -> None:
        """Call ``fn(self)`` once done (at once if already done), on the thread that
        dispatches the reply; keep it short. An exception it raises is printed to stderr
        and the other callbacks still run."""
        with self._lock:
            if not self._done:
                self._callbacks.append(fn)
                return
        self._run_callback(fn)

    def __await__(self):
        if not self._done and self._cycle is not None:
            raise self._cycle
        if not self._done:
            loop = asyncio.get_running_loop()
            arrived = loop.create_future()

            def wake(_: "Future") -> None:
                loop.call_soon_threadsafe(lambda: arrived.done() or arrived.set_result(None))

            on_main = threading.current_thread() is threading.main_thread()
            ticking = _Ticker(loop) if on_main else None
            waited = self._runtime.in_flight.waited if on_main else None  # as get()'s
            if waited is not None:
                waited.add(id(self))
            try:
                with self._mailbox.async_waiter():
                    self.add_done_callback(wake)
                    yield from arrived.__await__()
            finally:
                if ticking is not None:
                    ticking.cancel()
            if waited is not None:
                waited.discard(id(self))
        return self.get(0)

    def as_asyncio(self) -> "asyncio.Future[R]":
        """An ``asyncio.Future`` of the running loop that completes with this future's
        value or error, as in Monarch. Never blocks and never consumes this future: each
        call gives a fresh loop-local future, and ``get()``/``await`` still work.

        Raises ``RuntimeError`` when called with no running asyncio loop (use
        :meth:`get` there).
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(f"{self._description}: as_asyncio() needs a running asyncio event loop; "
                               "outside one, call .get()") from None
        if self._done:
            settled: asyncio.Future[R] = loop.create_future()
            if self._error is not None:
                settled.set_exception(self._error)
            else:
                settled.set_result(self._value)
            return settled

        async def observe() -> R:
            return await self

        return loop.create_task(observe(), name=f"monarch-nb-{self._description}")

    @classmethod
    def finished(cls, runtime: "ClientRuntime", description: str, value: Any = None) -> "Future":
        """A future already holding ``value``: what an operation that ran to completion
        before returning (``ProcMesh.stop()``) gives, so callers may ignore it, ``get()``
        it or ``await`` it alike."""
        future = cls(runtime, description)
        future._resolve(value)
        return future

    @classmethod
    def _from_coro(cls, coro: Coroutine[Any, Any, R], description: str = "coroutine") -> "Future[R]":
        """A future of what ``coro`` returns (or raises): Monarch's way of making one
        from a coroutine. ``coro`` starts at once, on an event loop of its own in a
        daemon thread, so it may await monarch_nb futures, iterate ``stream()`` and
        block without holding up the caller; this never blocks."""
        from .runtime import runtime  # (runtime's modules import this one)

        future: Future[R] = cls(runtime(), description)

        def run() -> None:
            try:
                value = asyncio.run(coro)
            except BaseException as e:  # noqa: BLE001 - the caller's get() raises it
                future._resolve(error=e)
            else:
                future._resolve(value)

        threading.Thread(target=run, name=f"monarch-nb-{description}", daemon=True).start()
        return future

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        return f"<Future {self._description} {state}>"


class FinishedCoroutine(Future):
    """A :meth:`Future.finished` future that is also a coroutine, for what Monarch
    declares ``async def`` and programs pass to ``asyncio.run`` (``asyncio.run(
    procs.logging_option(...))``, in Monarch's getting-started example); ``get()`` and
    ``await`` work as on any future."""

    def send(self, _value: Any) -> None:
        raise StopIteration(self.get(0))

    def throw(self, typ, value=None, traceback=None):
        raise typ if value is None else value

    def close(self) -> None:
        pass
