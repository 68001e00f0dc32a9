"""``@service_endpoint``: an endpoint with what a service needs to know about it (its
router, batching, whether a failed call may run again), and how a service reads that
back from an actor class."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

from ..proc.actor import endpoint, endpoint_names
from .routers import Router

_CONFIG_ATTR = "_monarch_nb_service_endpoint"


@dataclass(frozen=True)
class EndpointConfig:
    """How a service serves one endpoint. ``batch_size`` 1: no batching; above 1, up to
    that many concurrent ``route()`` calls go to a replica as one call taking a list,
    sent when the batch is full or ``batch_timeout`` seconds after its first request.
    ``idempotent``: a call whose replica failed under it may run again on another."""

    router: "type[Router] | Router | None" = None
    batch_size: int = 1
    batch_timeout: float = 0.01
    idempotent: bool = True

    @property
    def batching(self) -> bool:
        return self.batch_size > 1


DEFAULT = EndpointConfig()


def service_endpoint(fn: Callable | None = None, *, router: "type[Router] | Router | None" = None,
                     batch_size: int = 1, batch_timeout: float = 0.01, idempotent: bool = True) -> Any:
    """Mark an ``Actor`` method as an endpoint (as ``@endpoint`` does: actor meshes call
    it as usual) and say how a service serves it.

    ``router``: a :class:`Router` subclass or instance choosing the replica of each
    ``route()`` (default round robin). ``batch_size`` (>= 1): with more than 1 the method
    takes a *list* of requests and returns a list of as many results, in order;
    ``svc.NAME.route(x)`` then sends one request ``x`` and the service gathers up to
    ``batch_size`` concurrent ones into one call, waiting at most ``batch_timeout``
    seconds (> 0) after the first before sending a partial batch. ``idempotent=False``: a
    call in flight on a replica that fails is not run again elsewhere; its
    :class:`SupervisionError` reaches the caller.

    Raises ``ValueError`` for ``batch_size < 1`` or ``batch_timeout <= 0``, ``TypeError``
    for a router that is not a ``Router``.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"service_endpoint(batch_size={batch_size!r}): give an int >= 1 (1: no batching)")
    if not isinstance(batch_timeout, (int, float)) or batch_timeout <= 0:
        raise ValueError(f"service_endpoint(batch_timeout={batch_timeout!r}): give seconds > 0, e.g. 0.01")
    if router is not None and not (isinstance(router, Router) or (isinstance(router, type) and issubclass(router, Router))):
        raise TypeError(f"service_endpoint(router={router!r}): give a Router subclass (RoundRobinRouter, "
                        "LeastLoadedRouter, your own) or an instance of one")
    config = EndpointConfig(router, batch_size, float(batch_timeout), bool(idempotent))

    def mark(f: Callable) -> Callable:
        marked = endpoint(f)
        setattr(marked, _CONFIG_ATTR, config)
        return marked

    return mark(fn) if fn is not None else mark


def endpoint_configs(cls: type) -> dict[str, EndpointConfig]:
    """Every endpoint of actor class ``cls`` with its service configuration (plain
    ``@endpoint`` methods get the defaults)."""
    configs = {}
    for name in endpoint_names(cls):
        attr = inspect.getattr_static(cls, name, None)
        fn = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
        configs[name] = getattr(fn, _CONFIG_ATTR, DEFAULT)
    return configs
