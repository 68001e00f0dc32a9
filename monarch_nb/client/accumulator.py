"""``Accumulator``: fold the replies of an endpoint called on every actor of a mesh
into one value (Monarch's name and contract)."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

from .endpoint import Endpoint
from .future import Future

A = TypeVar("A")
R = TypeVar("R")


class Accumulator(Generic[A, R]):
    """``Accumulator(mesh.value, 0, operator.add).accumulate()`` calls ``mesh.value`` on
    every actor and returns a ``Future`` of ``combine(...combine(identity, r0)..., rN)``
    over the replies in the order they arrive (``endpoint.stream()``), as in Monarch:
    give a ``combine`` for which that order does not matter.

    ``reducer``: an associative function of two replies (``operator.add``); then the
    replies are folded with it where they are (each host's router folds its host's, so
    the client receives one value per host: :meth:`Endpoint.reduce`) and the future's
    value is ``combine(identity, folded)``."""

    def __init__(self, endpoint: Endpoint, identity: A, combine: Callable[[A, R], A],
                 reducer: Callable[[R, R], R] | None = None):
        if not callable(getattr(endpoint, "stream", None)):
            raise TypeError(f"Accumulator takes an endpoint of an actor mesh (mesh.ENDPOINT), not {endpoint!r}")
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine
        if reducer is not None and not callable(reducer):
            raise TypeError(f"Accumulator's reducer is a function of two replies (e.g. operator.add), not {reducer!r}")
        self._reducer = reducer

    def accumulate(self, *args, **kwargs) -> Future[A]:
        """Call the endpoint on every actor with these arguments; never blocks. The
        future raises the first error among the replies (:class:`ActorError`), or what
        ``combine`` raised."""
        if self._reducer is not None:
            folded = self._endpoint.reduce(self._reducer, *args, **kwargs)

            async def combined() -> A:
                return self._combine(self._identity, await folded)

            return Future._from_coro(combined(), f"accumulate {self._endpoint!r}")
        replies = self._endpoint.stream(*args, **kwargs)

        async def fold() -> A:
            value = self._identity
            for reply in replies:
                value = self._combine(value, await reply)
            return value

        return Future._from_coro(fold(), f"accumulate {self._endpoint!r}")
