"""Routers: which replica of a service serves one request.

A router sees only the replicas that are healthy now (each with ``idx``, its index in
the service, and ``load``, the calls this client has outstanding on it) and returns
one of them. Pure logic, no I/O: routers are called with the service's lock held, so
they must be quick and must not call the cluster.

    class FirstReplica(Router):
        def get_replica(self, healthy, sess_id=None, session_map=None):
            return min(healthy, key=lambda r: r.idx)

    @service_endpoint(router=FirstReplica)
    def generate(self, prompt): ...
"""

from __future__ import annotations

import abc
from typing import Protocol, Sequence, TypeVar


class RoutedReplica(Protocol):
    """What a router may read of a replica."""

    @property
    def idx(self) -> int: ...

    @property
    def load(self) -> int: ...


T = TypeVar("T", bound=RoutedReplica)


class Router(abc.ABC):
    """Base of routers. Subclass it and implement :meth:`get_replica`; pass the class
    (made once per service) or an instance to ``@service_endpoint(router=...)``."""

    @abc.abstractmethod
    def get_replica(self, healthy: Sequence[T], sess_id: str | None = None,
                    session_map: dict[str, int] | None = None) -> T:
        """One of ``healthy`` (never empty: the service checks first) to serve a
        request of session ``sess_id`` (``None``: no session); ``session_map`` maps
        session ids to the replica index serving them, which a session router updates."""


class RoundRobinRouter(Router):
    """Each healthy replica in turn: over ``k * len(healthy)`` calls each serves ``k``."""

    def __init__(self) -> None:
        self._turn = 0

    def get_replica(self, healthy: Sequence[T], sess_id: str | None = None,
                    session_map: dict[str, int] | None = None) -> T:
        self._turn = (self._turn + 1) % (1 << 62)
        return healthy[self._turn % len(healthy)]


class LeastLoadedRouter(Router):
    """The replica with the fewest calls outstanding from this client; the lowest index
    among equals after a rotating start, so that an idle service still spreads calls."""

    def __init__(self) -> None:
        self._turn = 0

    def get_replica(self, healthy: Sequence[T], sess_id: str | None = None,
                    session_map: dict[str, int] | None = None) -> T:
        self._turn = (self._turn + 1) % (1 << 62)
        start = self._turn % len(healthy)
        rotated = list(healthy[start:]) + list(healthy[:start])
        return min(rotated, key=lambda r: r.load)


class SessionRouter(Router):
    """Sticky sessions: a session's calls go to the replica ``session_map`` names for it
    while that replica is healthy; a new session, or one whose replica left the healthy
    set, is (re)assigned by ``fallback`` (least loaded by default) and ``session_map``
    updated. :attr:`moved` names the sessions reassigned from a replica that is gone,
    until the service reads and clears it."""

    def __init__(self, fallback: Router | None = None) -> None:
        self.fallback = fallback if fallback is not None else LeastLoadedRouter()
        self.moved: list[tuple[str, int, int]] = []  # (session, from replica idx, to replica idx)

    def get_replica(self, healthy: Sequence[T], sess_id: str | None = None,
                    session_map: dict[str, int] | None = None) -> T:
        if sess_id is None or session_map is None:
            raise ValueError("SessionRouter routes calls of a session: give sess_id and session_map")
        pinned = session_map.get(sess_id)
        if pinned is not None:
            for replica in healthy:
                if replica.idx == pinned:
                    return replica
        chosen = self.fallback.get_replica(healthy, sess_id, session_map)
        session_map[sess_id] = chosen.idx
        if pinned is not None:
            self.moved.append((sess_id, pinned, chosen.idx))
        return chosen


def make_router(router: "type[Router] | Router | None", default: "type[Router]" = RoundRobinRouter) -> Router:
    """A router from what ``@service_endpoint(router=...)`` was given: a ``Router``
    subclass (made here, one per service), an instance (used as is), or ``None``
    (``default``). Raises ``TypeError`` for anything else."""
    if router is None:
        return default()
    if isinstance(router, type) and issubclass(router, Router):
        return router()
    if isinstance(router, Router):
        return router
    raise TypeError(f"router={router!r} is not a Router; give a Router subclass such as RoundRobinRouter, "
                    "LeastLoadedRouter or your own subclass of monarch_nb.service.Router (or an instance of one)")
