"""This client's live services (``monarch_nb.service`` registers each one here, and how to
get handles on a cluster's services): what the client layer needs of services without
importing them (they sit above it).

The hub knows which proc meshes are a service's replicas and whether their procs run
(``Cluster.health()["services"]``); only the client that routes a service's calls knows
its requests, calls in flight, latency and restarts, which :meth:`annotate` adds.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Protocol


class ServiceLoad(Protocol):
    """What the registry asks of a live service (``monarch_nb.service.Service``)."""

    def replica_load(self) -> list[dict]:
        """Per replica, in order: ``state`` (this client's view: initializing, healthy,
        recovering, unhealthy, stopped), ``requests``, ``in_flight``, ``latency_p50_s``,
        ``latency_p99_s``, ``restarts``."""


# Fields of replica_load() that annotate() copies into the health tree's replica nodes.
LOAD_FIELDS = ("requests", "in_flight", "latency_p50_s", "latency_p99_s", "restarts")


class ServiceRegistry:
    """Live services of this client by (cluster id, service key), held weakly; and
    ``adopt``, set by ``monarch_nb.service`` when imported: ``adopt(cluster)`` gives
    handles on every service of ``cluster`` by name (``Cluster.services``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: "weakref.WeakValueDictionary[tuple[str, str], Any]" = weakref.WeakValueDictionary()
        self.adopt: Callable[[Any], dict] | None = None

    def add(self, cluster_id: str, key: str, service: ServiceLoad) -> None:
        with self._lock:
            self._live[(cluster_id, key)] = service

    def remove(self, cluster_id: str, key: str) -> None:
        with self._lock:
            self._live.pop((cluster_id, key), None)

    def get(self, cluster_id: str, key: str) -> Any:
        """The live service of ``key`` in ``cluster_id`` made or adopted by this client,
        or ``None``."""
        with self._lock:
            return self._live.get((cluster_id, key))

    def annotate(self, cluster_id: str, tree: dict) -> dict:
        """``tree`` (a health tree) with, on each replica of a service this client
        routes, this client's ``service_state`` and ``LOAD_FIELDS``. Returns ``tree``."""
        for node in tree.get("services", ()):
            service = self.get(cluster_id, node["key"])
            if service is None:
                continue
            loads = service.replica_load()
            node["routed_here"] = True
            for replica in node["replicas"]:
                if replica["replica"] < len(loads):
                    load = loads[replica["replica"]]
                    replica["service_state"] = load["state"]
                    replica.update({k: load[k] for k in LOAD_FIELDS})
        return tree
