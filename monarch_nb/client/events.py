"""Hub events for this process: subscribers hear about changes as the hub announces them.

The hub sends events (besides log lines) to each client's log inbox (see
``logs.LogReceiver``): ``health_changed`` when the registry changes (a mesh spawned,
stopped or restarted, a proc or host failed), ``actors_gone`` when actors died with
their proc or were stopped (address -> mesh, rank, why), ``debug_changed`` when the
debugger's list of paused ranks changed, and
``supervision`` when an actor failure was not handled by an owning actor. Every
event header carries ``cluster`` (the cluster id) and ``op``.

Subscribers run on the receiver thread: they must return quickly and never block on
a call to the cluster.
"""

from __future__ import annotations

import threading
import traceback
from typing import Callable

_lock = threading.Lock()
_subscribers: list[Callable[[dict], None]] = []


def subscribe(callback: Callable[[dict], None]) -> Callable[[], None]:
    """Call ``callback(event_header)`` for every hub event; returns a function that
    unsubscribes."""
    with _lock:
        _subscribers.append(callback)

    def unsubscribe() -> None:
        with _lock:
            if callback in _subscribers:
                _subscribers.remove(callback)

    return unsubscribe


def publish(event: dict) -> None:
    """Hand ``event`` to every subscriber; one that raises is reported and skipped."""
    with _lock:
        targets = list(_subscribers)
    for callback in targets:
        try:
            callback(event)
        except Exception:  # a broken subscriber must not stop the receiver thread
            traceback.print_exc()
