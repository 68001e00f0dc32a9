"""What travels from a service's handle to its replicas and back: a routed request, the
delivery of a batch's results to its callers, and the gathering of a fanout's replies."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..client.future import Future
from ..client.value_mesh import ValueMesh
from ..errors import SupervisionError
from .endpoint_config import EndpointConfig
from .errors import ServiceError

Deliver = Callable[[Any, "BaseException | None"], None]


@dataclass
class Request:
    """One routed call (or one batch of them) on its way to a replica. ``deliver(value,
    error)`` resolves the callers' futures, with the reply passed through ``unpack``
    first when given (which raises :class:`ServiceError` for a reply it can't take, a
    failure of the request's); ``exclude`` holds the (replica idx, generation) pairs it
    already failed on; ``attempts`` counts sends (a retry is the second)."""

    endpoint: str
    args: tuple
    kwargs: dict
    config: EndpointConfig
    deliver: Deliver
    sess_id: str | None = None
    count: int = 1  # user requests it carries (a batch: its size)
    counted: bool = True  # its failure is a caller's error (a fanout's part's is not: see FanIn)
    attempts: int = 0
    exclude: set = field(default_factory=set)
    unpack: Callable[[Any], Any] | None = None


def to_future(future: Future) -> Deliver:
    """A deliver function resolving ``future``."""

    def deliver(value: Any, error: BaseException | None) -> None:
        future._resolve(value, error)

    return deliver


def batch_results(values: Any, count: int, what: str) -> list:
    """The results of a batch call of ``count`` requests (``what``: ``service.endpoint``),
    in request order: the list the endpoint returned; from a replica of several procs
    (a ``ValueMesh`` of such lists, one per rank), one ``ValueMesh`` per request holding
    each rank's result for it, as ``route()`` gives for an unbatched endpoint. Raises
    :class:`ServiceError` when a list is not one result per request."""
    lists = values.values() if isinstance(values, ValueMesh) else [values]
    for got in lists:
        if not isinstance(got, (list, tuple)) or len(got) != count:
            said = f"{len(got)} results" if isinstance(got, (list, tuple)) else f"a {type(got).__name__}"
            raise ServiceError(f"{what} batches requests: it must return a list of one result per request, in "
                               f"order; it got {count} requests and returned {said}")
    if isinstance(values, ValueMesh):
        return [ValueMesh(values.extent, [got[i] for got in lists]) for i in range(count)]
    return list(values)


def to_batch(futures: list[Future]) -> Deliver:
    """A deliver function for one batch call, given its results unpacked
    (:func:`batch_unpacker`): result ``i`` goes to ``futures[i]``; an error fails them all."""

    def deliver(results: Any, error: BaseException | None) -> None:
        for i, future in enumerate(futures):
            future._resolve(None if error is not None else results[i], error)

    return deliver


def batch_unpacker(count: int, what: str) -> Callable[[Any], list]:
    """The ``Request.unpack`` of a batch call of ``count`` requests (``what``:
    ``service.endpoint``): :func:`batch_results`, which raises for a reply that is not
    one result per request."""
    return functools.partial(batch_results, count=count, what=what)


class FanIn:
    """Gathers the replies of a fanout to ``expected`` replicas into ``future``: the list
    of results in replica order, without the replicas that failed under the call (they
    are being replaced). An endpoint error fails the future (the first by replica);
    so does a supervision error when no replica answered."""

    def __init__(self, future: Future, expected: int, unwrap_batch: bool,
                 on_error: Callable[[], None] = lambda: None):
        self._future, self._expected, self._unwrap = future, expected, unwrap_batch
        self._on_error = on_error  # the caller gets an error: counted once for the fanout
        self._lock = threading.Lock()
        self._results: dict[int, tuple[Any, BaseException | None]] = {}

    def deliver_for(self, idx: int) -> Deliver:
        """The deliver function of replica ``idx``'s part."""

        def deliver(value: Any, error: BaseException | None) -> None:
            if self._unwrap and error is None:  # a batching endpoint called with a batch of one
                try:
                    value = batch_results(value, 1, "")[0]
                except ServiceError:
                    pass  # not one result: given as it is
            self._arrived(idx, value, error)

        return deliver

    def _arrived(self, idx: int, value: Any, error: BaseException | None) -> None:
        with self._lock:
            self._results[idx] = (value, error)
            if len(self._results) < self._expected:
                return
            results = dict(self._results)  # no loop under the lock: see monarch_nb.wire.interrupts
        ordered = [results[i] for i in sorted(results)]
        errors = [e for _, e in ordered if e is not None]
        kept = [v for v, e in ordered if e is None]
        raised = [e for e in errors if not isinstance(e, SupervisionError)]
        error = raised[0] if raised else errors[0] if errors and not kept else None
        if error is not None:
            self._on_error()
            self._future._resolve(None, error)
        else:
            self._future._resolve(kept)
