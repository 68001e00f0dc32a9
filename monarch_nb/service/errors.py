"""What a service raises and warns: one branch of the ``MonarchNbError`` hierarchy."""

from __future__ import annotations

from ..errors import MonarchNbError


class ServiceError(MonarchNbError, RuntimeError):
    """A service could not do what was asked (no replica left to serve, bad use)."""


class NoHealthyReplica(ServiceError):
    """Every replica of the service is out past its restart budget (until its window
    frees a restart) or stopped: nothing can serve the request now. ``svc.get_metrics()`` says why each one is."""


class ServiceStopped(ServiceError):
    """The service was shut down: ``route``/``fanout`` and sessions raise this at once,
    and requests still waiting for a replica fail with it."""


class UnknownSession(ServiceError, LookupError):
    """A session id that this service never started, or that was terminated."""


class SessionMoved(RuntimeWarning):
    """Warned when a session's replica failed and its calls go to another replica from
    now on (state the old replica kept for the session is gone)."""
