"""The one exception hierarchy of monarch_nb.

Every error a user can see derives from :class:`MonarchNbError`. Where an error is
also a classic Python error (a bad value, a bad type) it derives from that too, so
``except ValueError`` keeps working.
"""

from __future__ import annotations

import os
import traceback as tb_module
from dataclasses import dataclass

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class MonarchNbError(Exception):
    """Base class of every monarch_nb error."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of its own traceback: the caller's frames without
        monarch_nb's (the client's waits and re-raises are noise there), then the error
        (an :class:`ActorError`'s with the remote traceback, whose frames of notebook
        cells carry their source lines: ``wire.remote_error``)."""
        frames = [tb_module.FrameSummary(t.tb_frame.f_code.co_filename, t.tb_lineno, t.tb_frame.f_code.co_name)
                  for t in _walk(self.__traceback__)
                  if not t.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR)
                  and not t.tb_frame.f_locals.get("__tracebackhide__")]  # IPython's own frames say so
        local = "".join(tb_module.format_list(frames)).rstrip("\n").splitlines()
        return ["Traceback (most recent call last):", *local, f"{type(self).__name__}: {self}"]


def _walk(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


class ActorError(MonarchNbError):
    """An endpoint raised in one or more actors.

    Attributes:
        failures: list of :class:`RemoteFailure`, one per failed rank, in rank order.
        exception: the original exception of the first failed rank (its type is kept
            when it could be pickled; otherwise a :class:`RemoteException` stand-in).
        traceback: the remote traceback text of the first failed rank.
    """

    def __init__(self, mesh: str, endpoint: str, failures: list["RemoteFailure"], total: int, note: str = ""):
        self.mesh = mesh
        self.endpoint = endpoint
        self.failures = failures
        self.total = total
        self.note = note  # what else happened and what to do, said after the first line
        first = failures[0]
        self.exception = first.exception
        self.traceback = first.traceback
        self.points = [f.point for f in failures]
        super().__init__(self._message())
        self.__cause__ = first.exception

    def _message(self) -> str:
        first = self.failures[0]
        ranks = ", ".join(str(f.point) for f in self.failures[:8])
        if len(self.failures) > 8:
            ranks += f", ... ({len(self.failures) - 8} more)"
        # Opens with Monarch's wording, which programs written for Monarch match.
        head = f"Actor call {self.mesh}.{self.endpoint} failed in {len(self.failures)} of {self.total} actor(s): {ranks}"
        if self.note:
            head += f"\n{self.note}"
        return f"{head}\nfirst failure at {first.point}:\n{first.traceback.rstrip()}"

    def __reduce__(self):
        return (ActorError, (self.mesh, self.endpoint, self.failures, self.total, self.note))


class RemoteFailure:
    """One failed rank of an endpoint call: where (``point``), what (``exception``)
    and the remote traceback text (``traceback``)."""

    __slots__ = ("point", "exception", "traceback")

    def __init__(self, point, exception: BaseException, traceback: str):
        self.point = point
        self.exception = exception
        self.traceback = traceback

    def __reduce__(self):
        return (RemoteFailure, (self.point, self.exception, self.traceback))

    def __repr__(self) -> str:
        return f"RemoteFailure({self.point}, {self.exception!r})"


class RemoteException(Exception):
    """Stand-in for a remote exception whose type could not be pickled back.

    ``type_name`` is the qualified name of the original type; ``str()`` is its message.
    """

    def __init__(self, type_name: str, message: str):
        self.type_name = type_name
        self.message = message
        super().__init__(f"{type_name}: {message}")

    def __reduce__(self):
        return (RemoteException, (self.type_name, self.message))


class SupervisionError(MonarchNbError, RuntimeError):
    """A proc or actor that a call involves has failed (exited, killed, lost) or was
    stopped. A ``RuntimeError`` too, as in Monarch.

    ``failures``: a :class:`RemoteFailure` per failed rank of the call (empty when the
    error stands for one rank); the message names mesh, rank, host, pid and cause.
    ``events``: the :class:`MeshFailure` s behind it when it reports failures nobody
    handled (raised at the next call on the mesh), else empty."""

    def __init__(self, message: str, failures=()):
        super().__init__(message)
        self.failures = list(failures)
        self.events: list = []

    def __reduce__(self):
        return (_supervision_error, (str(self), self.failures, self.events))


class CallCycleError(MonarchNbError, RuntimeError):
    """A wait on a call that can never be answered: the call goes to an actor that is
    itself waiting on the caller (itself, or around a cycle such as A → B → A), and an
    actor runs one call at a time. ``cycle``: the actors, as ``MESH[RANK]``, from the
    one called to the one waiting. The call was sent; it runs once the actor is free."""

    def __init__(self, message: str, cycle=()):
        super().__init__(message)
        self.cycle = list(cycle)

    def __reduce__(self):
        return (CallCycleError, (str(self), self.cycle))


@dataclass(frozen=True)
class MeshFailure:
    """A failure that supervision reports: what ``__supervise__(failure)`` receives and
    what an unhandled failure raises at the next call on the mesh it hit.

    ``kind``: ``"proc_failed"`` (a proc exited, was killed or was lost with its host),
    ``"actor_failed"`` (an actor died while its proc lives on: its ``__init__`` or a
    ``broadcast`` endpoint raised, its ``__supervise__`` did not handle a failure, ...)
    or ``"endpoint_failed"`` (a ``broadcast`` endpoint raised in an actor whose class
    says ``survive_broadcast_errors``; the actor lives on).
    ``meshes``: the actor meshes hit; ``ranks``: their ranks hit; ``proc_mesh`` and
    ``rank`` (proc failures): the proc; ``why``: a sentence naming mesh, rank, host,
    pid and cause (with the proc's last stderr lines); ``endpoint``: for endpoint
    failures, with the remote ``traceback``; ``actor_report``: for an actor's death,
    Monarch's report of it (``The actor ... and all its descendants have failed``); for
    a proc's, that of each actor it ran, one a line."""

    kind: str
    meshes: tuple[str, ...]
    ranks: tuple[int, ...]
    why: str
    proc_mesh: str | None = None
    rank: int | None = None
    endpoint: str | None = None
    traceback: str = ""
    actor_report: str = ""

    @classmethod
    def from_event(cls, event: dict) -> "MeshFailure":
        return cls(event["kind"], tuple(event.get("meshes", ())), tuple(event.get("ranks", ())), event["why"],
                   event.get("proc_mesh"), event.get("rank"), event.get("endpoint"), event.get("traceback", ""),
                   event.get("report", ""))

    def __str__(self) -> str:
        # Monarch's layout: programs written for Monarch look for these fields in it.
        return f"MeshFailure(mesh_name={self.mesh_name}, crashed_ranks={list(self.ranks)}, event={self.why})"

    @property
    def mesh_name(self) -> str:
        """The name of the (first) actor mesh hit, else of the proc mesh (Monarch's name)."""
        return self.meshes[0] if self.meshes else (self.proc_mesh or "<none>")

    def report(self) -> str:
        """A readable report of this failure (Monarch's name): ``actor_report`` (else
        ``why``) and, for an endpoint's failure, the remote traceback."""
        head = self.actor_report or self.why
        return f"{head}\n{self.traceback}".rstrip() if self.traceback else head


def actor_name(class_name: str, mesh: str, extent: dict, rank: int) -> str:
    """An actor as supervision names it, in Monarch's form: ``module.Class
    mesh{'gpus': 1/4}`` (each dimension: index/size) for rank 1 of a ``{"gpus": 4}`` mesh."""
    coords, left = [], rank
    for label, size in reversed(list(extent.items())):  # row-major: the last dimension varies fastest
        left, index = divmod(left, size)
        coords.append(f"{label!r}: {index}/{size}")
    return f"{class_name} {mesh}{{{', '.join(reversed(coords))}}}"


def actor_gone_report(actor: str, why: str, stopped: bool = False) -> str:
    """Why a call can't reach ``actor`` (see :func:`actor_name`): it failed for ``why``
    (which names mesh, rank and cause), or it was ``stopped``. The first line is
    Monarch's wording, which programs written for Monarch match."""
    if stopped:
        return f"Supervision event: actor {actor} has status:\n  stopped: {why}"
    return f"{_FAILED_LEAD} {actor} and all its descendants have failed:\n  {why}"


_FAILED_LEAD = "The actor"


def reports_a_failure(report: str) -> bool:
    """Does ``report`` (from :func:`actor_gone_report`) say the actor failed, rather
    than that it was stopped?"""
    return report.startswith(_FAILED_LEAD)


class ClusterNotFound(MonarchNbError, LookupError):
    """No running cluster has the requested name."""


class ClusterError(MonarchNbError, RuntimeError):
    """The cluster (hub, host agents) could not do what was asked."""


class HubTimeout(ClusterError, TimeoutError):
    """The hub did not answer a control request within its timeout."""


class InvalidRequest(ClusterError, ValueError):
    """The hub refused a control request as bad input (e.g. a name taken by another mesh)."""


class MessageTooLarge(MonarchNbError, ValueError):
    """A message is over the size limit (see ``monarch_nb.wire.frames.max_message_bytes``)."""


class SerializationError(MonarchNbError, TypeError):
    """An argument or return value could not be pickled."""


def _supervision_error(message: str, failures, events) -> SupervisionError:
    """Unpickle a :class:`SupervisionError` with its ``events``."""
    error = SupervisionError(message, failures)
    error.events = list(events)
    return error
