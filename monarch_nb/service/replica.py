"""One replica of a service: its proc mesh and actor mesh (replaced when it fails), its
state, and what it served."""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .defaults import MAX_RESTARTS, RESTART_WINDOW_S
from .restarts import RestartBudget

LATENCY_WINDOW = 1024  # latencies kept per replica for the percentiles (the most recent)


class ReplicaState(str, enum.Enum):
    """``INITIALIZING`` (procs and actor starting) → ``HEALTHY`` (serving) → on a failure
    ``RECOVERING`` (being replaced) → ``HEALTHY``, or ``UNHEALTHY`` once it failed more
    often than its restart budget allows (left out until its ``restart_window_s`` frees a
    restart, then ``RECOVERING`` again) → ``STOPPED`` (shut down)."""

    INITIALIZING = "initializing"
    HEALTHY = "healthy"
    RECOVERING = "recovering"
    UNHEALTHY = "unhealthy"
    STOPPED = "stopped"


def percentile(values: "list[float] | deque[float]", q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ``values``; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class ReplicaStats:
    """Requests a replica served: ``requests`` sent to it (a batch counts each request),
    ``failed`` among them, ``in_flight`` now, and recent latencies in seconds (from the
    send to the reply, over the last ``LATENCY_WINDOW``)."""

    requests: int = 0
    failed: int = 0
    in_flight: int = 0
    latencies: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))


@dataclass
class Replica:
    """Replica ``idx`` of a service. ``procs`` and ``actors`` are the current proc mesh
    and actor mesh (``None`` until its first start; new ones after each replacement);
    ``restarts`` counts replacements over its life (``budget`` says how many more it may
    have now), ``last_failure`` says why it last failed and ``recoveries_s`` how long
    each replacement took (seconds from the failure being seen to the replica serving
    again)."""

    idx: int
    state: ReplicaState = ReplicaState.INITIALIZING
    procs: Any = None
    actors: Any = None
    generation: int = 0  # its meshes' names end with it: a failure of an older one is old news
    restarts: int = 0
    budget: RestartBudget = field(default_factory=lambda: RestartBudget(MAX_RESTARTS, RESTART_WINDOW_S), repr=False)
    last_failure: str = ""
    recoveries_s: list[float] = field(default_factory=list)
    failed_at: float = 0.0  # time.monotonic() when its last failure was seen
    stats: ReplicaStats = field(default_factory=ReplicaStats)
    # Fanouts made while it was being replaced, (endpoint, args, kwargs): sent to it once its
    # on_replica_start hook ran, before it serves (a weight update made meanwhile)
    missed: list = field(default_factory=list, repr=False)
    _adverbs: dict = field(default_factory=dict, repr=False)  # endpoint -> its call_one (or call) on actors

    def serve_from(self, procs: Any, actors: Any) -> None:
        """Take new meshes (a start or a replacement)."""
        self.procs, self.actors, self._adverbs = procs, actors, {}

    def adverb(self, endpoint: str) -> Any:
        """How a routed call reaches this replica's actors: ``call_one`` of ``endpoint``
        with one proc (its value), ``call`` with several (a ``ValueMesh``); made once
        per mesh, since routing calls it for every request."""
        adverbs = self._adverbs
        found = adverbs.get(endpoint)
        if found is None:
            handle = self.endpoint(endpoint)
            found = adverbs[endpoint] = handle.call_one if len(self.actors) == 1 else handle.call
        return found

    def endpoint(self, name: str) -> Any:
        """Endpoint ``name`` of this replica's actor mesh, made once per mesh."""
        key = ("endpoint", name)
        found = self._adverbs.get(key)
        if found is None:
            found = self._adverbs[key] = getattr(self.actors, name)
        return found

    @property
    def load(self) -> int:
        """Calls this client has outstanding on it (what least-loaded routing compares)."""
        return self.stats.in_flight

    @property
    def healthy(self) -> bool:
        return self.state is ReplicaState.HEALTHY

    def metrics(self) -> dict:
        """What ``Service.get_metrics()`` reports of it: state, requests, failed,
        in-flight, latency p50/p99 (seconds), restarts, last failure, pids (of its procs
        while it is healthy; none while it starts, is replaced, is out past its budget or
        stopped, when its procs are dead, being stopped or not yet serving)."""
        lat = self.stats.latencies
        pids = list(self.procs.pids) if self.procs is not None and self.state is ReplicaState.HEALTHY else []
        return {"replica": self.idx, "state": self.state.value, "requests": self.stats.requests,
                "failed": self.stats.failed, "in_flight": self.stats.in_flight,
                "latency_p50_s": percentile(lat, 50), "latency_p99_s": percentile(lat, 99),
                "restarts": self.restarts, "last_failure": self.last_failure,
                "recoveries_s": [round(s, 3) for s in self.recoveries_s], "pids": pids}
