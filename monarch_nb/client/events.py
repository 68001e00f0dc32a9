"""Hub events for this process: one inbox receives everything the hub announces to
this client, and subscribers hear about it.

The hub sends to each client's event inbox (the address it gave in ``client_alive``):
``log_lines`` (lines its calls caused, handed to :class:`~monarch_nb.client.logs.LogLines`),
``health_changed`` when the registry changes (a mesh spawned, stopped or restarted, a
proc or host failed), ``actors_gone`` when actors died with their proc or were stopped
(address -> mesh, rank, why), ``debug_changed`` when the debugger's list of paused
ranks changed, and ``supervision`` when an actor failure was not handled by an owning
actor. Every event header carries ``cluster`` (the cluster id) and ``op``.

Subscribers run on the receiver thread: they must return quickly and never block on
a call to the cluster.
"""

from __future__ import annotations

import threading
import time
import traceback
from typing import TYPE_CHECKING, Callable

from ..protocol import envelope, events
from ..wire import frames as wire_frames
from ..wire import sockets

if TYPE_CHECKING:
    from .logs import LogLines


class EventBus:
    """Subscribers to hub events, called in the order they subscribed."""

    def __init__(self):
        self._lock = threading.Lock()
        self._subscribers: list[Callable[[dict], None]] = []

    def subscribe(self, callback: Callable[[dict], None]) -> Callable[[], None]:
        """Call ``callback(event_header)`` for every hub event; returns a function that
        unsubscribes."""
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def publish(self, event: dict) -> None:
        """Hand ``event`` to every subscriber; one that raises is reported and skipped."""
        with self._lock:
            targets = list(self._subscribers)
        for callback in targets:
            try:
                callback(event)
            except Exception:  # a broken subscriber must not stop the receiver thread
                traceback.print_exc()


class EventReceiver:
    """This process's event inbox, served by a daemon thread (its own socket, so log
    traffic never delays a reply): log lines go to ``lines``, whose folding window
    also paces the thread; every other event to ``bus``."""

    def __init__(self, bus: EventBus, lines: "LogLines"):
        self._bus, self._lines = bus, lines
        self._sock, self.address = sockets.bind_inbox()
        self._guard = wire_frames.ReplayGuard()
        threading.Thread(target=self._run, name="monarch-nb-events", daemon=True).start()

    def _run(self) -> None:
        while True:
            due = self._lines.next_due()
            timeout = 100 if due is None else max(0, int((due - time.time()) * 1000) + 1)
            self._sock.poll(timeout)
            # The folding clock reads before the drain: on a loaded machine this thread
            # can lose the CPU for longer than the fold window, and batches that arrived
            # meanwhile must be folded in before anything counts as due.
            now = time.time()
            while sockets.queued(self._sock):
                self._receive(sockets.recv_frames(self._sock, sockets.NOBLOCK))
            self._lines.emit_due(now)

    def _receive(self, frames) -> None:
        try:
            message = wire_frames.decode(frames, self._guard)
        except wire_frames.BadMessage:
            return
        header = message.header
        if header.get(envelope.OP) == events.LOG_LINES:
            self._lines.add(header[events.CLUSTER], header["seq"], header["records"])
        else:
            self._bus.publish(header)
