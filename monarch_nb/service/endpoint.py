"""``svc.NAME``: a service's endpoint, reached with ``route`` (one replica) or
``fanout`` (every healthy replica)."""

from __future__ import annotations

import sys
from typing import Any, Protocol

from ..client.future import Future


class Routes(Protocol):
    """What an endpoint needs of its service (``service.Service``, which imports this)."""

    name: str

    def _route(self, endpoint: str, args: tuple, kwargs: dict) -> Future: ...

    def _fanout(self, endpoint: str, args: tuple, kwargs: dict) -> Future: ...


class ServiceEndpoint:
    """Endpoint ``name`` of every replica of a service."""

    def __init__(self, service: Routes, name: str):
        self._service = service
        self._name = name

    def route(self, *args: Any, **kwargs: Any) -> Future:
        """Call the endpoint on one healthy replica, chosen by the endpoint's router (or
        the current session's replica, or the one of ``sess_id=SID``); returns a
        ``Future`` of its return value (a ``ValueMesh`` when replicas have several procs).
        Non-blocking: with no replica healthy yet (starting, or being replaced) the call
        waits in the service and is sent when one is. The future raises the endpoint's
        ``ActorError``; ``SupervisionError`` only for an ``idempotent=False`` endpoint
        whose replica failed under it (others run once more elsewhere);
        ``ServiceStopped`` when the service is shut down before it is answered.

        Raises at once ``ServiceStopped`` after ``shutdown()``, ``NoHealthyReplica`` when
        every replica is out past its restart budget, ``UnknownSession`` for a ``sess_id`` not started
        (or terminated), and ``TypeError`` for a batching endpoint given anything but one
        request argument."""
        return self._service._route(self._name, args, kwargs)

    choose = route  # Monarch's name for "one actor, load-balanced"

    def fanout(self, *args: Any, **kwargs: Any) -> Future:
        """Call the endpoint on every healthy replica (replicas still starting for the
        first time are waited for, and so is a replacement when none is healthy); returns
        a ``Future`` of the list of their results in replica order. A replica that fails during the call is left out of the list (it
        is being replaced); an endpoint that raises makes the future raise its
        ``ActorError``; a shutdown before every replica answered makes it raise
        ``ServiceStopped``. Raises at once as :meth:`route`."""
        return self._service._fanout(self._name, args, kwargs)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """:meth:`fanout` without waiting for or returning results (fire and forget).
        Nobody waits for it, so what it raises is printed to stderr once its replies are
        in (under the notebook cell running then), not dropped."""
        self._service._fanout(self._name, args, kwargs).add_done_callback(self._report)

    def _report(self, future: Future) -> None:
        error = future.exception()
        if error is not None:
            print(f"[monarch] service {self._service.name!r}: {self._name}.broadcast(...) failed: "
                  f"{type(error).__name__}: {error}", file=sys.stderr, flush=True)

    def _not_here(self, adverb: str) -> Any:
        raise TypeError(f"service endpoint {self._service.name}.{self._name} has no .{adverb}(); use .route(...) "
                        f"for one replica or .fanout(...) for every healthy replica")

    def call(self, *args: Any, **kwargs: Any) -> Any:
        return self._not_here("call")

    def call_one(self, *args: Any, **kwargs: Any) -> Any:
        return self._not_here("call_one")

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._not_here("stream")

    def __repr__(self) -> str:
        return f"<ServiceEndpoint {self._service.name}.{self._name}>"
