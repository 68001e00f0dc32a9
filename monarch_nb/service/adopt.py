"""Handles on a cluster's services from the hub's records (``protocol.services``): what
``Cluster.services`` and :func:`connect_service` return, also in a client that did not
make them, e.g. a notebook kernel restarted while its retained cluster ran on.

An adopted service routes and fans out to the replicas' actors as the original did.
This client has no actor class to spawn new meshes from, so a failed replica is
restarted in place: its procs start again and the hub makes its actor again from the
constructor arguments it kept (``ActorMesh.restart``). Its ``on_replica_start`` hook is
the one given here (a hook is code of the client that made the service, gone with it).
"""

from __future__ import annotations

from typing import Callable

from ..client.cluster import Cluster, default_cluster
from ..client.runtime import runtime
from ..protocol import services as records
from . import defaults
from .endpoint_config import EndpointConfig
from .replica import Replica, ReplicaState
from .routers import LeastLoadedRouter, RoundRobinRouter, Router
from .service import Service

# Routers an adopted service can make again by name; a user's own router becomes the default.
BUILT_IN_ROUTERS: dict[str, type[Router]] = {r.__name__: r for r in (RoundRobinRouter, LeastLoadedRouter)}


def services(cluster: Cluster | None = None,
             on_replica_start: Callable[[Replica], None] | None = None) -> dict[str, Service]:
    """Every service of ``cluster`` (default: the connected one) by name, as working
    handles: the live one where this client made or adopted it already, else one adopted
    now (with ``on_replica_start`` as its hook). One hub round trip (``Cluster.info()``);
    a replica found failed starts being restarted at once."""
    cluster = cluster if cluster is not None else default_cluster()
    info = cluster.info()
    cluster_id = cluster._info["cluster_id"]
    found: dict[str, Service] = {}
    for name, record in records.group(info["proc_meshes"]).items():
        live = runtime().services.get(cluster_id, record[records.KEY])
        found[name] = live if live is not None else adopt(cluster, info, record, on_replica_start)
    return found


def connect_service(name: str, cluster: Cluster | None = None,
                    on_replica_start: Callable[[Replica], None] | None = None) -> Service:
    """The service ``name`` of ``cluster`` (default: the connected one); see
    :func:`services`. Raises ``KeyError`` naming the services there are."""
    found = services(cluster, on_replica_start)
    if name not in found:
        raise KeyError(f"no service {name!r} in this cluster (services: {', '.join(sorted(found)) or 'none'}); "
                       "make one with Cls.options(num_replicas=...).as_service()")
    return found[name]


def adopt(cluster: Cluster, info: dict, record: dict, on_replica_start: Callable[[Replica], None] | None) -> Service:
    """A handle on the service of ``record`` (an entry of ``protocol.services.group``),
    its replicas' meshes found in ``info`` (``Cluster.info()``)."""
    service = Service.__new__(Service)
    service._class, service._args, service._kwargs = None, (), {}
    configs = {endpoint: EndpointConfig(BUILT_IN_ROUTERS.get(c.get(records.ROUTER) or ""), c[records.BATCH_SIZE],
                                        c[records.BATCH_TIMEOUT], c[records.IDEMPOTENT])
               for endpoint, c in record[records.ENDPOINTS].items()}
    max_restarts, restart_window_s = restart_budget_of(record)
    service._setup(record[records.NAME], record[records.KEY], configs, record[records.REPLICAS], record[records.PROCS],
                   max_restarts, on_replica_start, cluster.host_mesh(), record[records.CLASS],
                   restart_window_s=restart_window_s)
    with service._lock:  # the loop in a function of its own: see monarch_nb.wire.interrupts
        failed = _serve_from_records(service, cluster, info, record)
    for replica, mesh, why in failed:
        service._failed_replica(replica, mesh, why)
    if service._health is not None:  # (the defaults: a service's options are not kept with the hub)
        service._health.start()
    return service


def restart_budget_of(record: dict) -> tuple[int, float | None]:
    """The restart budget kept in a service's ``record``: (``max_restarts``,
    ``restart_window_s``). A record written before the window existed gets the default
    window: its service counted over its whole life only because no window could be
    given, and the replicas' earlier restarts are not counted again (this client does
    not know when they were)."""
    return record[records.MAX_RESTARTS], record.get(records.RESTART_WINDOW_S, defaults.RESTART_WINDOW_S)


def _serve_from_records(service: Service, cluster: Cluster, info: dict, record: dict) -> list[tuple[Replica, str, str]]:
    """Point each replica of ``service`` at its meshes in ``info`` (the caller holds the
    service's lock); the replicas whose actor is found gone, as (replica, its mesh,
    why)."""
    failed: list[tuple[Replica, str, str]] = []
    for replica in service.replicas:
        mesh = record["replica_meshes"].get(replica.idx)
        generation = record["replica_generations"].get(replica.idx, 0)
        replica.generation, replica.restarts = generation, max(0, generation - 1)
        procs = info["proc_meshes"].get(mesh or "")
        actors = info["actor_meshes"].get(f"{mesh}/{mesh}")
        if procs is None or actors is None:
            replica.state = ReplicaState.UNHEALTHY
            replica.last_failure = ("its actor mesh is gone (the client replacing it ended before it was up); "
                                    "shut the service down and make it again")
            continue
        assert mesh is not None
        service._handle_failures_of(mesh)
        replica.serve_from(cluster._proc_mesh(procs), cluster._actor_mesh(actors))
        service._by_mesh[mesh] = replica
        replica.state = ReplicaState.HEALTHY
        gone = replica.actors.initialized.exception()
        if gone is not None:
            failed.append((replica, mesh, str(gone)))
    return failed


def _install() -> None:
    """``Cluster.services`` asks this module (the client layer can't import services)."""
    runtime().services.adopt = services


_install()
