"""Sessions: calls pinned to one replica of a service, and the bookkeeping of which
replica serves each session.

``with svc.session():`` (or ``async with``) makes the calls of that block, in that
thread or asyncio task, go to one replica; each service keeps its own current session
(a ``ContextVar`` holding service name -> session id), so sessions of two services nest.
"""

from __future__ import annotations

import contextvars
import uuid
from types import MappingProxyType, TracebackType
from typing import Mapping, Protocol, Sequence, TypeVar

from .errors import UnknownSession
from .routers import RoutedReplica, SessionRouter

T = TypeVar("T", bound=RoutedReplica)


class SessionOwner(Protocol):
    """What a session needs of its service (``service.Service``, which imports this)."""

    name: str
    _key: str

    def start_session(self) -> str: ...

    def terminate_session(self, sess_id: str, missing_ok: bool = False) -> None: ...

    def _check_session(self, sess_id: str) -> None: ...

_current: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "monarch_nb_service_sessions", default=MappingProxyType({}))


def current_session(service_key: str) -> str | None:
    """The session id the running code is inside for service ``service_key``, or ``None``."""
    return _current.get().get(service_key)


class SessionContext:
    """What ``svc.session()`` returns: a context manager, plain or async, that starts a
    session on entry (``session_id`` then names it) and terminates it on exit. Give
    ``session_id`` to enter an existing session (started with ``svc.start_session()``),
    which is then left running on exit."""

    def __init__(self, service: SessionOwner, session_id: str | None = None):
        self._service = service
        self._own = session_id is None
        self.session_id = session_id
        self._token: contextvars.Token | None = None

    def __enter__(self) -> "SessionContext":
        if self.session_id is None:
            self.session_id = self._service.start_session()
        else:
            self._service._check_session(self.session_id)
        sessions = dict(_current.get())
        sessions[self._service._key] = self.session_id
        self._token = _current.set(MappingProxyType(sessions))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        if self._own and self.session_id is not None:
            self._service.terminate_session(self.session_id, missing_ok=True)

    async def __aenter__(self) -> "SessionContext":
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"<session {self.session_id} of service {self._service.name!r}>"


class Sessions:
    """A service's open sessions and the replica serving each. Not locked: the service
    calls it with its own lock held."""

    def __init__(self, service_name: str):
        self._service_name = service_name
        self._router = SessionRouter()
        self._moves: dict[str, int] = {}  # open session -> times it moved to another replica
        self._replica: dict[str, int] = {}  # session -> replica idx serving it (after its first call)
        self._orphaned: dict[str, int] = {}  # session -> replica idx it had until that failed

    def __len__(self) -> int:
        return len(self._moves)

    def __contains__(self, sess_id: object) -> bool:
        return sess_id in self._moves

    def start(self) -> str:
        sess_id = uuid.uuid4().hex
        self._moves[sess_id] = 0
        return sess_id

    def check(self, sess_id: str) -> None:
        """Raises :class:`UnknownSession` unless ``sess_id`` is open."""
        if sess_id not in self._moves:
            raise UnknownSession(f"service {self._service_name!r} has no session {sess_id!r} (never started, or "
                                 "terminated); start one with svc.start_session() or `with svc.session():`")

    def terminate(self, sess_id: str, missing_ok: bool = False) -> None:
        if sess_id not in self._moves and not missing_ok:
            self.check(sess_id)
        self._moves.pop(sess_id, None)
        self._replica.pop(sess_id, None)
        self._orphaned.pop(sess_id, None)

    def replica_of(self, sess_id: str) -> int | None:
        self.check(sess_id)
        return self._replica.get(sess_id)

    def pick(self, healthy: Sequence[T], sess_id: str) -> tuple[T, list[tuple[str, int, int]]]:
        """The replica among ``healthy`` (not empty) serving ``sess_id``, and the moves
        this made: (session, from replica idx, to replica idx), to be warned of."""
        replica = self._router.get_replica(healthy, sess_id, self._replica)
        moved, self._router.moved = self._router.moved, []
        was = self._orphaned.pop(sess_id, None)
        if was is not None:
            moved.append((sess_id, was, replica.idx))
        for sid, _, _ in moved:
            self._moves[sid] = self._moves.get(sid, 0) + 1
        return replica, moved

    def replica_failed(self, idx: int) -> None:
        """Replica ``idx`` failed: its sessions move at their next call (and say so)."""
        for sess_id in [s for s, i in self._replica.items() if i == idx]:
            del self._replica[sess_id]
            self._orphaned[sess_id] = idx
