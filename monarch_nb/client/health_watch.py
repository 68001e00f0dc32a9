"""A live feed of a cluster's health tree, for displays that keep it current.

The hub announces registry changes (``health_changed``, ``actors_gone``); what changes
without an event (busy, paused, memory, CPU) is caught by a slow tick. Requests to
the hub run on the feed's own thread, never on the event receiver's thread.
"""

from __future__ import annotations

import threading
from typing import Callable

from ..errors import MonarchNbError
from ..protocol import envelope, events
from .runtime import runtime

TICK_S = 1.0  # refresh this often without events (busy/paused/memory change silently)
MIN_INTERVAL_S = 0.25  # at most 4 refreshes a second, however many events arrive
EVENT_OPS = (events.HEALTH_CHANGED, events.ACTORS_GONE)


class HealthWatch:
    """Calls ``on_tree(tree)`` from a daemon thread with a fresh ``cluster.health()``:
    at once, soon after every hub event about the cluster (at most once per
    ``min_interval_s`` seconds) and every ``tick_s`` seconds otherwise.

    It ends by itself when the cluster is stopped or disconnected (``on_end("cluster
    stopped")``/``"disconnected"``) or its hub fails (``on_end(reason)``); :meth:`stop`
    ends it without calling ``on_end``. Exceptions from the callbacks are printed and
    end the feed (a display that can't draw should not keep asking)."""

    def __init__(self, cluster, on_tree: Callable[[dict], None], on_end: Callable[[str], None],
                 tick_s: float = TICK_S, min_interval_s: float = MIN_INTERVAL_S):
        self.cluster = cluster
        self._on_tree, self._on_end = on_tree, on_end
        self._tick_s, self._min_interval_s = tick_s, min_interval_s
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self.refreshes = 0  # trees delivered so far
        self._unsubscribe = runtime().events.subscribe(self._on_event)
        self._thread = threading.Thread(target=self._run, name="monarch-nb-health", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _on_event(self, header: dict) -> None:  # on the receiver thread: just a flag
        if header.get(envelope.OP) in EVENT_OPS and header.get(events.CLUSTER) == self.cluster._info["cluster_id"]:
            self._wake.set()

    def _ended(self) -> str | None:
        if self.cluster._stopped:
            return "cluster stopped"
        presence = self.cluster._presence
        if presence is None or presence.closed:
            return "disconnected"
        return None

    def _run(self) -> None:
        try:
            while not self._stopped.is_set():
                reason = self._ended()
                if reason is None:
                    self._wake.clear()
                    try:
                        tree = self.cluster.health()
                    except MonarchNbError as e:
                        reason = self._ended() or f"no live updates: {e}"
                    else:
                        if self._stopped.is_set():
                            return
                        self._on_tree(tree)
                        self.refreshes += 1
                if reason is not None:
                    if not self._stopped.is_set():
                        self._on_end(reason)
                    return
                if self._stopped.wait(self._min_interval_s):
                    return
                self._wake.wait(max(0.0, self._tick_s - self._min_interval_s))
        except Exception:  # a broken display must not be retried every second
            import traceback

            traceback.print_exc()
        finally:
            self._unsubscribe()

    def stop(self, timeout: float | None = None) -> None:
        """End the feed; waits up to ``timeout`` seconds for its thread (an ongoing hub
        request finishes first, ~1 s at most). No callback runs after this returns
        (unless the wait timed out)."""
        self._stopped.set()
        self._wake.set()
        self._unsubscribe()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
