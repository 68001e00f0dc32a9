"""A live feed of a cluster's health tree, for displays that keep it current.

The feed subscribes to the hub's tree (``health_subscribe``: the whole tree once), then
applies the deltas the hub pushes (``health_delta`` events, ``protocol.health_tree``):
nothing is asked again while nothing changes, and a change costs the hub one delta, not
a status request per proc. A delta that does not follow the last one (a lost event, a
recovered hub) and a feed the hub stopped keeping alive are answered by subscribing
again. A new hub (``Cluster.recover``) keeps no subscription of the old one: the feed
subscribes to it as soon as its cluster finds it (``Cluster.on_new_hub``), not after
``SILENT_S`` of silence (the fallback where a new hub can't be told apart: one on
another machine). The subscription runs on the feed's own thread, never on the event receiver's.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
import uuid
from typing import Callable

from ..errors import ClusterError, MonarchNbError
from ..protocol import envelope, events, health_tree, hub_ops
from ..wire import frames as wire_frames
from . import discovery
from .runtime import runtime

TICK_S = 1.0  # memory, CPU, uptime and busy-for figures are refreshed this often
MIN_INTERVAL_S = 0.25  # at most 4 refreshes a second, however many deltas arrive
SILENT_S = 15.0  # no delta (nor keepalive, sent every 5 s) for this long: subscribe again
CHECK_S = 0.5  # how often the feed looks whether its cluster was stopped or disconnected


class HealthWatch:
    """Calls ``on_tree(tree)`` from a daemon thread with the cluster's health tree (as
    ``cluster.health()`` returns it): at once, then soon after each change the hub
    pushes (at most once per ``min_interval_s`` seconds); the figures that change on
    their own (memory, CPU, uptime, busy-for) are refreshed every ``tick_s`` seconds.

    It ends by itself when the cluster is stopped or disconnected (``on_end("cluster
    stopped")``/``"disconnected"``) or its hub fails (``on_end(reason)``; a hub that
    died on this machine is waited for, until the cluster's grace period ends, and the
    feed goes on with the recovered one); :meth:`stop`
    ends it without calling ``on_end``. While its hub is down and may yet be recovered,
    ``on_stale(reason)`` (if given) is called once: the last tree is no longer kept
    current; the next ``on_tree`` is the recovered hub's. Exceptions from the callbacks
    are printed and end the feed (a display that can't draw should not keep asking)."""

    def __init__(self, cluster, on_tree: Callable[[dict], None], on_end: Callable[[str], None],
                 tick_s: float = TICK_S, min_interval_s: float = MIN_INTERVAL_S,
                 on_stale: Callable[[str], None] | None = None):
        self.cluster = cluster
        self._on_tree, self._on_end, self._on_stale = on_tree, on_end, on_stale
        self._tick_s, self._min_interval_s = tick_s, min_interval_s
        self._id = uuid.uuid4().hex
        self._deltas: queue.Queue = queue.Queue()
        self._arrived = threading.Event()  # a delta was queued (or the feed is stopping)
        self._stopped = threading.Event()
        self.refreshes = 0  # trees delivered so far
        self.subscriptions = 0  # times it subscribed (once, unless a delta went missing)
        self._new_hub = threading.Event()  # the cluster found a new hub: subscribe to it
        # The hub died (on this machine): the feed waits for the cluster to find a new one.
        self.hub_down = False
        self._unsubscribe = runtime().events.subscribe(self._on_event)
        on_new_hub = getattr(cluster, "on_new_hub", None)  # (a stand-in cluster of a test may lack it)
        self._forget_hub = on_new_hub(self._hub_replaced) if on_new_hub is not None else (lambda: None)
        self._thread = threading.Thread(target=self._run, name="monarch-nb-health", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _on_event(self, header: dict) -> None:  # on the receiver thread: just queue it
        if header.get(envelope.OP) == events.HEALTH_DELTA and header.get(hub_ops.SUBSCRIPTION) == self._id:
            self._deltas.put(header)
            self._arrived.set()

    def _hub_replaced(self) -> None:  # on the cluster's presence thread: just flag it
        self._new_hub.set()
        self._arrived.set()

    def _ended(self) -> str | None:
        # Stopped by this client, or by another (`monarch-nb cluster stop`: the hub removes
        # the directory on its way out); not waited for as a hub that may be recovered.
        if self.cluster._stopped or not self.cluster.path.exists():
            return "cluster stopped"
        presence = self.cluster._presence
        if presence is None or presence.closed:
            return "disconnected"
        if getattr(self.cluster, "_hub_lost_told", False):  # dead past its grace: no hub will come back
            return "the hub died and was not recovered within its grace period"
        return None

    def _subscribe(self) -> tuple[dict, int]:
        """The whole tree and its version; raises ``MonarchNbError`` (the hub failed)."""
        self.subscriptions += 1
        reply = self.cluster.hub.request(hub_ops.HEALTH_SUBSCRIBE, timeout=30.0, **{
            hub_ops.SUBSCRIPTION: self._id, hub_ops.CLIENT_ID: runtime().client_id,
            hub_ops.EVENT_INBOX: runtime().event_inbox().address, hub_ops.VOLATILE_EVERY_S: self._tick_s})
        return reply[hub_ops.TREE], reply[hub_ops.TREE_SEQ]

    def _run(self) -> None:
        tree: dict | None = None
        seq = 0
        heard = time.monotonic()
        try:
            while not self._stopped.is_set():
                reason = self._ended()
                fresh = False
                if self._new_hub.is_set():
                    self._new_hub.clear()
                    tree, self.hub_down = None, False  # the old hub's subscription died with it
                if reason is None and not self.hub_down and getattr(self.cluster, "_hub_lost_since", None) is not None:
                    # Its cluster found the hub dead (on this machine, within about a
                    # second): the subscription died with it. Before, the last tree
                    # (all healthy) showed on, unmarked, until SILENT_S of silence.
                    tree = None
                    self._went_down()
                if reason is None and tree is None and not self.hub_down:
                    try:
                        tree, seq = self._subscribe()
                    except MonarchNbError as e:
                        # A hub known dead here may be recovered within its grace: wait
                        # for the cluster to find the new one (_ended says when not).
                        if discovery.hub_process_problem(self.cluster._info):
                            self._went_down()
                        else:
                            reason = self._ended() or f"no live updates: {e}"
                    else:
                        fresh, heard = True, time.monotonic()
                if reason is None:
                    tree, seq, changed, got = self._apply_queued(tree, seq)
                    heard = time.monotonic() if got else heard
                    if tree is not None and (fresh or changed):
                        view = runtime().services.annotate(self.cluster._info["cluster_id"], copy.deepcopy(tree))
                        if self._stopped.is_set():
                            return
                        self._on_tree(view)
                        self.refreshes += 1
                    if time.monotonic() - heard > SILENT_S:
                        tree = None  # the hub no longer feeds this subscription (a recovered hub)
                if reason is not None:
                    if not self._stopped.is_set():
                        self._on_end(reason)
                    return
                if self._stopped.wait(self._min_interval_s):
                    return
                self._wait_for_delta()
        except Exception:  # a broken display must not be retried every second
            import traceback

            traceback.print_exc()
        finally:
            self._unsubscribe()
            self._forget_hub()
            self._tell_hub_done()

    def _went_down(self) -> None:
        """The hub is dead and may be recovered: wait for the new one (``_new_hub``),
        telling the display (``on_stale``) that the tree it shows is the last one."""
        self.hub_down = True
        if self._on_stale is not None and not self._stopped.is_set():
            self._on_stale(f"no live updates: the hub of cluster {self.cluster.name!r} is down; they resume "
                           f"once it is recovered (`monarch-nb cluster recover {self.cluster.name}`)")

    def _wait_for_delta(self) -> None:
        """Until a delta is queued, the feed is stopped, or ``CHECK_S`` passed."""
        self._arrived.wait(CHECK_S)
        self._arrived.clear()  # what is queued is applied next, before the next wait

    def _apply_queued(self, tree: dict | None, seq: int) -> tuple[dict | None, int, bool, bool]:
        """Apply the queued deltas that follow version ``seq``; returns the tree (``None``
        when one is missing: subscribe again), its version, whether it changed, and
        whether anything was heard."""
        changed = got = False
        while tree is not None:
            try:
                header = self._deltas.get_nowait()
            except queue.Empty:
                break
            got = True
            version = header[hub_ops.TREE_SEQ]
            if version <= seq:
                continue  # a keepalive, or older than the tree subscribed to
            if version != seq + 1:
                return None, 0, False, got
            tree = health_tree.apply(tree, header[events.DELTA])
            seq, changed = version, True
        return tree, seq, changed, got

    def _tell_hub_done(self) -> None:
        """Best effort: a hub that misses it drops the subscription with the client."""
        if self.cluster._stopped:
            return
        try:
            runtime().mailbox.send(self.cluster.hub.address, wire_frames.encode(
                self.cluster._info["cluster_id"], {envelope.OP: hub_ops.HEALTH_UNSUBSCRIBE,
                                                   hub_ops.SUBSCRIPTION: self._id}))
        except (ClusterError, OSError):
            pass

    def stop(self, timeout: float | None = None) -> None:
        """End the feed; waits up to ``timeout`` seconds for its thread (an ongoing hub
        request finishes first). No callback runs after this returns (unless the wait
        timed out)."""
        self._stopped.set()
        self._arrived.set()
        self._unsubscribe()
        self._forget_hub()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
