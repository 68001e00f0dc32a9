"""Batching: concurrent requests to one endpoint gathered into one call.

A batch is sent when it holds ``batch_size`` requests (by the thread that added the
last one) or ``batch_timeout`` seconds after its first request arrived (by the
batcher's own thread, started on first use). Requests of different sessions are never
mixed, so a batch goes to one session's replica.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Callable, Hashable


class _Batch:
    __slots__ = ("key", "items", "sent")

    def __init__(self, key: Hashable):
        self.key = key
        self.items: list = []
        self.sent = False


class Batcher:
    """Gathers items per key and hands each full or timed-out batch to
    ``send(key, items)`` (outside the batcher's lock; what it raises is printed)."""

    def __init__(self, send: Callable[[Hashable, list], None], name: str = "service"):
        self._send = send
        self._name = name
        self._lock = threading.Condition()
        self._open: dict[Hashable, _Batch] = {}
        self._due: list[tuple[float, int, _Batch]] = []  # (monotonic deadline, tie-break, batch)
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.batches_sent = 0  # batches handed to send so far (full or timed out)

    def add(self, key: Hashable, item: object, size: int, timeout: float) -> None:
        """Add ``item`` to the open batch of ``key`` (opening one that is due in
        ``timeout`` seconds); a batch that reaches ``size`` items is sent now, from this
        thread. Raises ``RuntimeError`` once closed."""
        full = None
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name}: the batcher is closed")
            batch = self._open.get(key)
            if batch is None:
                batch = self._open[key] = _Batch(key)
                heapq.heappush(self._due, (time.monotonic() + timeout, next(self._order), batch))
                self._start()
                self._lock.notify()
            batch.items.append(item)
            if len(batch.items) >= size:
                full = self._take(batch)
        if full is not None:
            self._hand_over(full)

    def close(self) -> list:
        """Stop batching; returns the items of batches not sent yet (the caller fails them)."""
        with self._lock:
            self._closed = True
            left = self._open_items()  # the loop in a method of its own: see monarch_nb.wire.interrupts
            self._open.clear()
            self._due.clear()
            self._lock.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
        return left

    def _open_items(self) -> list:
        """The items of the batches not sent yet (the caller holds the lock)."""
        return [item for batch in self._open.values() for item in batch.items]

    def _take(self, batch: _Batch) -> _Batch:
        """Close ``batch`` for new items (the caller holds the lock)."""
        batch.sent = True
        if self._open.get(batch.key) is batch:
            del self._open[batch.key]
        self.batches_sent += 1
        return batch

    def _hand_over(self, batch: _Batch) -> None:
        try:
            self._send(batch.key, batch.items)
        except Exception:  # noqa: BLE001 - send resolves its own requests; a bug must not end the thread
            import traceback

            traceback.print_exc()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"monarch-nb-batcher-{self._name}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:  # the loops in a method of their own: see monarch_nb.wire.interrupts
                due = self._next_due()
            if due is None:
                return
            for batch in due:
                self._hand_over(batch)

    def _next_due(self) -> list[_Batch] | None:
        """Wait (the caller holds the lock) until a batch is due or the batcher closes;
        the due batches, taken (``None``: it closed)."""
        while not self._closed and (not self._due or self._due[0][0] > time.monotonic()):
            self._lock.wait(None if not self._due else self._due[0][0] - time.monotonic())
        if self._closed:
            return None
        due = []
        now = time.monotonic()
        while self._due and self._due[0][0] <= now:
            _, _, batch = heapq.heappop(self._due)
            if not batch.sent:  # (a full one left already)
                due.append(self._take(batch))
        return due
