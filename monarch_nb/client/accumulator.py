"""``Accumulator``: fold the replies of an endpoint called on every actor of a mesh
into one value (Monarch's name and contract)."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

from .endpoint import Endpoint
from .future import Future
from .runtime import runtime

A = TypeVar("A")
R = TypeVar("R")


class Accumulator(Generic[A, R]):
    """``Accumulator(mesh.value, 0, operator.add).accumulate()`` calls ``mesh.value`` on
    every actor and returns a ``Future`` of ``combine(...combine(identity, r0)..., rN)``
    over the replies in rank order."""

    def __init__(self, endpoint: Endpoint, identity: A, combine: Callable[[A, R], A]):
        if not isinstance(endpoint, Endpoint):
            raise TypeError(f"Accumulator takes an endpoint of an actor mesh (mesh.ENDPOINT), not {endpoint!r}")
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args, **kwargs) -> Future[A]:
        """Call the endpoint on every actor with these arguments; never blocks. The
        future raises the call's error (:class:`ActorError`), or what ``combine``
        raised."""
        result: Future[A] = Future(runtime(), f"accumulate {self._endpoint!r}")
        call = self._endpoint.call(*args, **kwargs)

        def fold(done: Future) -> None:
            try:
                value = self._identity
                for reply in done.get(0).values():
                    value = self._combine(value, reply)
            except BaseException as e:  # noqa: BLE001 - the caller's get() raises it
                result._resolve(error=e)
            else:
                result._resolve(value)

        call.add_done_callback(fold)
        return result
