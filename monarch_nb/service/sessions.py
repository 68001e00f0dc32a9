"""Sessions: calls pinned to one replica of a service.

``with svc.session():`` (or ``async with``) makes the calls of that block, in that
thread or asyncio task, go to one replica; each service keeps its own current session
(a ``ContextVar`` holding service name -> session id), so sessions of two services nest.
"""

from __future__ import annotations

import contextvars
from types import MappingProxyType, TracebackType
from typing import Mapping, Protocol


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
