"""A host router's folds (``reduce()`` through the host routers), on a thread of their own.

The reducer is the user's code, and so is the unpickling of each value it folds: it may
be slow (a sum of large tensors), block, or raise anything (``sys.exit`` too). Run on the
router's thread, it held up every call, reply and port value of every client on that
host while it ran, and a router that does not run looks stopped (``Router._note_running``).
So the router hands each value to fold, and the end of each reduce, to :class:`FoldThread`,
which folds them in the order given and hands back the replies to send (the fold, or a
failure); the router sends them with its next batch.

:class:`Folds` is the logic alone (no thread, no socket), for the tests too.
"""

from __future__ import annotations

import collections
import os
import queue
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

from ..protocol import envelope, router_ops
from ..wire import serialize
from .replies import Entry, failure

REDUCERS_KEPT = 64  # unpickled reducers remembered (by their pickled bytes)

# (where its replies go: the router's destination, opaque here; the client's port)
Route = tuple[Any, Hashable]
# The jobs, in order: (VALUE, route, pickled reducer, reply header, body, buffers) for a
# value to fold; (DONE, route) once every rank of a reduce on this host answered.
VALUE, DONE = "value", "done"
Job = tuple


@dataclass
class _Fold:
    """One reduce's fold on this host so far."""

    reducer: Callable[[Any, Any], Any] | None  # None: it can't be loaded here (the client folds)
    folded: list[int] = field(default_factory=list)  # ranks whose values ``value`` folds
    value: Any = None


class Folds:
    """The reduces being folded on this host: :meth:`run` takes jobs in order and gives
    the replies to send, as ``(destination, Entry)``."""

    def __init__(self):
        self._open: dict[Route, _Fold] = {}
        self._reducers: dict[bytes, Callable] = {}

    def run(self, jobs: list[Job]) -> list[tuple[Any, Entry]]:
        out: list[tuple[Any, Entry]] = []
        for kind, *fields in jobs:
            if kind == VALUE:
                self._value(out, *fields)
            else:
                self._done(out, *fields)
        return out

    def _fold_of(self, route: Route, pickled: bytes) -> _Fold:
        fold = self._open.get(route)
        if fold is None:
            fold = self._open[route] = _Fold(self._load(pickled))
        return fold

    def _load(self, pickled: bytes) -> Callable | None:
        reducer = self._reducers.get(pickled)
        if reducer is None:
            if len(self._reducers) >= REDUCERS_KEPT:
                self._reducers.clear()
            try:
                reducer = self._reducers[pickled] = serialize.loads(pickled)
            except BaseException:  # noqa: BLE001 - e.g. its module can't be imported here, or exits: the client folds
                return None
        return reducer

    def _value(self, out: list, route: Route, pickled: bytes, header: dict, body, buffers: list) -> None:
        dest, port = route
        fold = self._fold_of(route, pickled)
        rank = header[envelope.RANK]
        if fold.reducer is None:  # passed on as it came, for the client to fold
            out.append((dest, Entry(header, body, buffers)))
            return
        # What the user's reducer, or the unpickling of a value, raises is the reduce's
        # error: any exception, sys.exit's too.
        try:
            value = serialize.loads(body, buffers)
            fold.value = value if not fold.folded else fold.reducer(fold.value, value)
            fold.folded.append(rank)
        except BaseException as e:  # noqa: BLE001
            out.append((dest, failure(port, rank, e, fold=True)))

    def _done(self, out: list, route: Route) -> None:
        dest, port = route
        fold = self._open.pop(route, None)
        if fold is None or not fold.folded:
            return
        try:  # the folded value's pickling is the user's code: what it raises is every folded rank's error
            body, buffers = serialize.dumps(fold.value, "a folded value")
        except BaseException as e:  # noqa: BLE001
            error = failure(port, fold.folded[0], e, fold=True)
            error.header[router_ops.FOLDED] = fold.folded
            out.append((dest, error))
            return
        header = {envelope.PORT: port, envelope.RANK: fold.folded[0], envelope.OK: True,
                  router_ops.FOLDED: fold.folded}
        out.append((dest, Entry(header, body, [b.raw() for b in buffers])))


class FoldThread:
    """Runs :class:`Folds` on a daemon thread: :meth:`submit` jobs; once replies are
    ready, ``wake_fd`` turns readable and :meth:`take` gives them (the router's thread)."""

    def __init__(self, host_id: str):
        self._host_id = host_id
        self._folds = Folds()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._ready: collections.deque = collections.deque()
        self.wake_fd, self._wake_w = os.pipe()
        os.set_blocking(self.wake_fd, False)
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._run, name="monarch-nb-router-folds", daemon=True)
        self._thread.start()

    def submit(self, jobs: list[Job]) -> None:
        if jobs:
            self._jobs.put(jobs)

    def take(self) -> list[tuple[Any, Entry]]:
        """The replies folded since the last take, in order."""
        try:
            while os.read(self.wake_fd, 4096):
                pass
        except BlockingIOError:
            pass
        out = []
        while self._ready:
            out.append(self._ready.popleft())
        return out

    def stop(self, timeout: float) -> None:
        """End the thread (one stuck in a reducer is left: a daemon) and close the pipe."""
        self._jobs.put(None)
        self._thread.join(timeout)
        os.close(self.wake_fd)
        os.close(self._wake_w)

    def _run(self) -> None:
        while True:
            jobs = self._jobs.get()
            if jobs is None:
                return
            try:
                self._ready.extend(self._folds.run(jobs))
            except Exception:  # noqa: BLE001 - a bug here must not end the folds of every later reduce
                print(f"monarch_nb router {self._host_id}: a fold failed:\n{traceback.format_exc()}",
                      file=sys.stderr, end="")
            try:
                os.write(self._wake_w, b"!")
            except (BlockingIOError, OSError):  # full: the router wakes anyway; closed: stopping
                pass
