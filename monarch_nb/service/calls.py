"""What travels from a service's handle to its replicas and back: a routed request, the
delivery of a batch's results to its callers, and the gathering of a fanout's replies."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..client.future import Future
from ..errors import SupervisionError
from .endpoint_config import EndpointConfig
from .errors import ServiceError

Deliver = Callable[[Any, "BaseException | None"], None]


@dataclass
class Request:
    """One routed call (or one batch of them) on its way to a replica. ``deliver(value,
    error)`` resolves the callers' futures; ``exclude`` holds the (replica idx,
    generation) pairs it already failed on; ``attempts`` counts sends (a retry is the
    second)."""

    endpoint: str
    args: tuple
    kwargs: dict
    config: EndpointConfig
    deliver: Deliver
    sess_id: str | None = None
    count: int = 1  # user requests it carries (a batch: its size)
    attempts: int = 0
    exclude: set = field(default_factory=set)


def to_future(future: Future) -> Deliver:
    """A deliver function resolving ``future``."""

    def deliver(value: Any, error: BaseException | None) -> None:
        future._resolve(value, error)

    return deliver


def to_batch(futures: list[Future], what: str) -> Deliver:
    """A deliver function for one batch call (``what``: ``service.endpoint``): result
    ``i`` of the list it returns goes to ``futures[i]``; an error, or a result that is
    not a list of ``len(futures)``, fails them all."""

    def deliver(values: Any, error: BaseException | None) -> None:
        if error is None and (not isinstance(values, (list, tuple)) or len(values) != len(futures)):
            got = f"{len(values)} results" if isinstance(values, (list, tuple)) else f"a {type(values).__name__}"
            error = ServiceError(f"{what} batches requests: it must return a list of one result per request, in "
                                 f"order; it got {len(futures)} requests and returned {got}")
        for i, future in enumerate(futures):
            future._resolve(None if error is not None else values[i], error)

    return deliver


class FanIn:
    """Gathers the replies of a fanout to ``expected`` replicas into ``future``: the list
    of results in replica order, without the replicas that failed under the call (they
    are being replaced). An endpoint error fails the future (the first by replica);
    so does a supervision error when no replica answered."""

    def __init__(self, future: Future, expected: int, unwrap_batch: bool):
        self._future, self._expected, self._unwrap = future, expected, unwrap_batch
        self._lock = threading.Lock()
        self._results: dict[int, tuple[Any, BaseException | None]] = {}

    def deliver_for(self, idx: int) -> Deliver:
        """The deliver function of replica ``idx``'s part."""

        def deliver(value: Any, error: BaseException | None) -> None:
            if self._unwrap and error is None and isinstance(value, (list, tuple)) and len(value) == 1:
                value = value[0]  # a batching endpoint called with a batch of one
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
        if raised:
            self._future._resolve(None, raised[0])
        elif errors and not kept:
            self._future._resolve(None, errors[0])
        else:
            self._future._resolve(kept)
