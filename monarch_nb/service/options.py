"""``Cls.options(procs=..., num_replicas=...)``: how to deploy an actor class, then
``.as_service(*args, **kwargs)`` to run it as a service (TorchForge's spelling).

``monarch_nb.actor`` puts :func:`options` on ``Actor`` as a classmethod;
``ServiceOptions(Cls, ...)`` is the same thing for code that type-checks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from .defaults import HEALTH_CHECK_PERIOD_S, HEALTH_CHECK_TIMEOUT_S, MAX_RESTARTS, RESTART_WINDOW_S

if TYPE_CHECKING:
    from ..client.host_mesh import HostMesh
    from .replica import Replica
    from .service import Service


@dataclass(frozen=True)
class ServiceOptions:
    """Deployment of ``actor_class``: ``num_replicas`` replicas of ``procs`` procs per
    host of ``hosts`` (a ``HostMesh``; ``None``: ``this_host()``). ``name`` names the
    service and its meshes (default: the class name, lower case). ``max_restarts``: how
    many times one replica may be replaced within any ``restart_window_s`` seconds
    (``None``: within the service's whole life); failed starts count. ``on_replica_start(replica)``: run after each
    start of a replica, before it serves (load weights into ``replica.actors``).
    ``health_check_period_s`` (``None``: no checks) and ``health_check_timeout_s``: how
    often each proc of a healthy replica is asked for its status, and how long it may
    take to answer before the replica is failed and replaced (``service.health_checks``)."""

    actor_class: type
    procs: int = 1
    num_replicas: int = 1
    hosts: "HostMesh | None" = None
    name: str | None = None
    max_restarts: int = MAX_RESTARTS
    on_replica_start: "Callable[[Replica], None] | None" = None
    health_check_period_s: float | None = HEALTH_CHECK_PERIOD_S
    health_check_timeout_s: float = HEALTH_CHECK_TIMEOUT_S
    restart_window_s: float | None = RESTART_WINDOW_S

    def as_service(self, *args: Any, **kwargs: Any) -> "Service":
        """Start the replicas of ``actor_class(*args, **kwargs)``; returns the
        :class:`Service` at once (``await`` it, or call ``wait_ready()``, to wait for the
        replicas). Raises ``ValueError``/``TypeError`` for bad options at once."""
        from .service import Service

        return Service(self.actor_class, args, kwargs, procs=self.procs, num_replicas=self.num_replicas,
                       hosts=self.hosts, name=self.name, max_restarts=self.max_restarts,
                       on_replica_start=self.on_replica_start, health_check_period_s=self.health_check_period_s,
                       health_check_timeout_s=self.health_check_timeout_s, restart_window_s=self.restart_window_s)


def options(cls: type, *, procs: int = 1, num_replicas: int = 1, hosts: "HostMesh | None" = None,
            name: str | None = None, max_restarts: int = MAX_RESTARTS,
            on_replica_start: "Callable[[Replica], None] | None" = None, health_check_period_s: float | None = HEALTH_CHECK_PERIOD_S,
            health_check_timeout_s: float = HEALTH_CHECK_TIMEOUT_S, restart_window_s: float | None = RESTART_WINDOW_S,
            **unknown: Any) -> ServiceOptions:
    """``Cls.options(...)`` (a classmethod of ``Actor``): see :class:`ServiceOptions`.
    Raises ``TypeError`` naming an unknown option."""
    if unknown:
        raise TypeError(f"{cls.__name__}.options() got unknown option(s) {sorted(unknown)}; it takes procs, "
                        "num_replicas, hosts, name, max_restarts, restart_window_s, on_replica_start, "
                        "health_check_period_s and health_check_timeout_s")
    return ServiceOptions(cls, procs, num_replicas, hosts, name, max_restarts, on_replica_start,
                          health_check_period_s, health_check_timeout_s, restart_window_s)
