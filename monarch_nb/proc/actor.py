"""``Actor``, ``@endpoint`` and the per-message context an endpoint runs in."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

from ..mesh import Extent, Point

_ENDPOINT_MARK = "__monarch_nb_endpoint__"
_EXPLICIT_PORT_MARK = "__monarch_nb_explicit_port__"
_CONCURRENT_MARK = "__monarch_nb_concurrent__"


class Actor:
    """Base class of user actors.

    An actor lives in one proc and handles one message at a time, in arrival order.
    Mark the methods clients may call with :func:`endpoint`; both ``def`` and
    ``async def`` endpoints are supported. ``__init__`` runs in the actor's own
    thread in the proc, with :func:`current_rank` already set.

    Failures follow Monarch's supervision rules unless the class opts out (two
    notebook-friendly options, read from the class when an actor is spawned):

    - ``survive_broadcast_errors``: an exception raised by an endpoint called with
      ``broadcast`` (nobody waits for its answer) kills the actor, a supervision fault
      its mesh's owner or the client hears of. ``True``: the actor lives on; the failure
      is still reported, and the next call on the mesh raises it once.
    - ``survive_unhandled_children``: a failure of a mesh this actor spawned that its
      ``__supervise__`` does not handle (it returns something falsy, raises, or is not
      defined) kills this actor too, so the failure goes on up to its own owner or the
      client. ``True``: this actor lives on; the failure goes to the client, and the
      next call on this actor's mesh raises it once.

    ``__supervise__(failure)`` (``def`` or ``async def``) hears of each failure of a mesh
    this actor spawned before anyone else: when a call fails because an actor of that
    mesh died, the failure is queued ahead of this actor's next message before the
    caller's ``SupervisionError`` is raised, so it runs before any call sent to this
    actor after that error (an ``async`` actor runs it at once, also while an endpoint
    awaits; a busy thread actor as soon as its current endpoint returns).
    """

    survive_broadcast_errors: bool = False
    survive_unhandled_children: bool = False

    @functools.cached_property
    def logger(self) -> logging.Logger:
        """A logger named for the actor's class, passing every level (Monarch's
        ``self.logger``). Handlers are the proc's logging configuration (Python's
        default: warnings and above to stderr, which the cluster's logs keep)."""
        logger = logging.getLogger(type(self).__name__)
        logger.setLevel(logging.DEBUG)
        return logger

    if TYPE_CHECKING:
        # A spawned mesh is typed as its actor class (``ProcMesh.spawn``, as in Monarch),
        # so that a type checker follows ``mesh.ENDPOINT.call(...)`` to the method; these
        # are the mesh's own members (``client.actor_mesh.ActorMesh``) it then meets.
        def slice(self: _A, **dims: Any) -> _A: ...

        def flatten(self: _A, name: str) -> _A: ...

        @property
        def extent(self) -> Extent: ...

        def size(self, dim: str | Sequence[str] | None = None) -> int: ...

        def __len__(self) -> int: ...

        def stop(self) -> Any: ...  # a finished Future[None] (client layer)


_A = TypeVar("_A", bound=Actor)


def endpoint(fn: Callable | None = None, *, propagate: Any = None,
             explicit_response_port: bool = False) -> Callable:
    """Mark an ``Actor`` method as callable from clients (``mesh.method.call(...)``).

    Usable bare (``@endpoint``) or with keyword options (``@endpoint()``);
    ``propagate`` is accepted for Monarch compatibility and ignored. With
    ``explicit_response_port=True`` the method gets the caller's
    :class:`~monarch_nb.wire.port.Port` as first argument (after ``self``) and answers
    through it, now or later, from any thread; its return value is ignored, and an
    exception it raises kills the actor (as in Monarch).
    """
    return _marker(fn, explicit_response_port, concurrent=False)


def concurrent_endpoint(fn: Callable | None = None, *, propagate: Any = None,
                        explicit_response_port: bool = False) -> Callable:
    """An ``async def`` endpoint whose calls run concurrently on the actor's event loop:
    the actor takes its next message as soon as such a call starts, while plain
    endpoints (``def`` or ``async def``) run one at a time in arrival order. Options as
    :func:`endpoint`; it does not wrap ``@endpoint`` (raises ``ValueError``)."""

    def check(f: Callable) -> Callable:
        if is_endpoint(f):
            raise ValueError("concurrent_endpoint does not wrap @endpoint; pass endpoint options to "
                             "@concurrent_endpoint")
        if not inspect.iscoroutinefunction(f):
            raise ValueError("concurrent_endpoint can only wrap async endpoints")
        return _marker(f, explicit_response_port, concurrent=True)

    return check(fn) if fn is not None else check


def _marker(fn: Callable | None, explicit_response_port: bool, concurrent: bool) -> Callable:
    def mark(f: Callable) -> Callable:
        if not callable(f):
            raise TypeError(f"@endpoint decorates methods, not {type(f).__name__}")
        setattr(f, _ENDPOINT_MARK, True)
        setattr(f, _EXPLICIT_PORT_MARK, explicit_response_port)
        setattr(f, _CONCURRENT_MARK, concurrent)
        # Monarch's attribute: its reply does not come from the dispatcher when the
        # method returns (an explicit port, or a concurrent call's task answering later).
        setattr(f, "_explicit_response_port", explicit_response_port or concurrent)
        return f

    return mark(fn) if fn is not None else mark


def is_endpoint(obj: Any) -> bool:
    return callable(obj) and getattr(obj, _ENDPOINT_MARK, False) is True


def takes_port(method: Any) -> bool:
    """Whether endpoint ``method`` answers through an explicit port (its first argument)."""
    return getattr(method, _EXPLICIT_PORT_MARK, False) is True


def is_concurrent(method: Any) -> bool:
    """Whether endpoint ``method``'s calls run concurrently (``@concurrent_endpoint``)."""
    return getattr(method, _CONCURRENT_MARK, False) is True


def endpoint_names(cls: type) -> dict[str, bool]:
    """Endpoints of ``cls`` mapped to whether each is ``async``."""
    found = {}
    for name in dir(cls):
        attr = inspect.getattr_static(cls, name, None)
        fn = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
        if is_endpoint(fn):
            found[name] = inspect.iscoroutinefunction(fn)
    return found


class ActorAborted(BaseException):
    """Raised by :meth:`ActorInstance.abort`: a ``BaseException`` that is not an
    ``Exception``, so that the actor dies of it (a supervision fault) unless user code
    catches it on its way out."""


@dataclass(frozen=True)
class ActorInstance:
    """Who is running: the actor mesh name, this actor's point in it, and its proc.

    Monarch's ``context().actor_instance``: ``rank``, ``name``, ``class_name``,
    ``proc_id``, ``actor_id`` and ``abort()``."""

    mesh_name: str
    rank: Point
    proc_id: str
    pid: int
    address: str = ""  # where its messages go (set once its socket is bound)
    class_name: str = ""  # the actor's class, "module.QualName" (set once constructed)

    @property
    def name(self) -> str:
        """The name its actor mesh was spawned with (``"client"`` in the client)."""
        return self.mesh_name

    @property
    def actor_id(self) -> str:
        """This actor, unique in its cluster: ``PROC_ID.MESH[RANK]`` (e.g.
        ``procs1/3.trainers[3]``); ``client`` outside an actor."""
        if self.mesh_name == "client":
            return "client"
        return f"{self.proc_id}.{self.mesh_name}[{self.rank.rank}]"

    def abort(self, reason: str | None = None) -> None:
        """End this actor with a failure, as in Monarch: raises :class:`ActorAborted`
        (do not catch it), which kills the actor. The call being handled and every later
        call to it raise :class:`SupervisionError`, and the failure goes to the mesh's
        owner (``__supervise__``) or the client's ``unhandled_fault_hook``, naming
        ``reason`` (default ``"no reason provided"``). In ``__init__`` it is the
        ``__init__`` failure fault. Never returns."""
        raise ActorAborted(f"{self.actor_id} ({self.class_name or 'client'}) aborted: "
                           f"{reason or 'no reason provided'}")


@dataclass(frozen=True)
class Context:
    """What :func:`context` returns while an endpoint runs."""

    actor_instance: ActorInstance
    message_rank: Point


_CLIENT_POINT = Point((), Extent({}))
_in_proc: dict = {}  # set by a proc at start: its cluster directory and proc id


def set_proc(cluster_dir: str, proc_id: str) -> None:
    """Called once by a proc's entry point: actors here belong to that cluster."""
    _in_proc.update(cluster_dir=cluster_dir, proc_id=proc_id)


def proc_identity() -> dict | None:
    """``{"cluster_dir", "proc_id"}`` in a proc, ``None`` in a client."""
    return dict(_in_proc) or None


def owner_of_new_meshes() -> dict | None:
    """The actor a mesh spawned now belongs to (its supervisor): the one handling the
    current message on this thread, or ``None`` (the client owns it, or the cluster in an
    :func:`unowned` block)."""
    ctx = current_context()
    if ctx is None or getattr(_current, "unowned", False):
        return None
    actor = ctx.actor_instance
    return {"mesh": actor.mesh_name, "rank": actor.rank.rank, "address": actor.address, "proc": actor.proc_id}
_current = threading.local()


class _ActorEnds:
    """What runs when an actor of this process ends (:func:`at_actor_end`), by actor id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hooks: dict[str, list[Callable[[], None]]] = {}

    def add(self, actor_id: str, callback: Callable[[], None]) -> None:
        with self._lock:
            self._hooks.setdefault(actor_id, []).append(callback)

    def run(self, actor_id: str) -> None:
        with self._lock:
            hooks = self._hooks.pop(actor_id, [])
        for callback in hooks:
            try:
                callback()
            except Exception:  # noqa: BLE001 - one hook's failure must not skip the others'
                logging.getLogger(__name__).exception("a hook run as actor %s ended failed", actor_id)


_ends = _ActorEnds()


def at_actor_end(callback: Callable[[], None]) -> str | None:
    """Run ``callback()`` once the actor handling the current message (on this thread, or
    on a thread it started) ends: stopped, its mesh stopped, or its proc leaving by a
    stop, on its own thread after its ``__cleanup__``. Returns that actor's id, or
    ``None`` outside an actor (the client: nothing is kept, nothing will run)."""
    actor_id = current_actor_id()
    if actor_id is not None:
        _ends.add(actor_id, callback)
    return actor_id


def current_actor_id() -> str | None:
    """The id of the actor handling the current message (on this thread, or on a thread
    it started); ``None`` outside an actor."""
    ctx = current_context()
    return None if ctx is None or ctx.actor_instance.mesh_name == "client" else ctx.actor_instance.actor_id


def actor_ended(actor_id: str) -> None:
    """Called by the actor's loop as it ends: runs its :func:`at_actor_end` hooks."""
    _ends.run(actor_id)


@contextlib.contextmanager
def unowned():
    """Meshes spawned by this thread inside this block belong to the cluster, not to
    the actor running here: they outlive it and no ``__supervise__`` hears of their
    failures (controllers live so)."""
    before = getattr(_current, "unowned", False)
    _current.unowned = True
    try:
        yield
    finally:
        _current.unowned = before


def _set_current(ctx: Context | None) -> None:
    _current.ctx = ctx


def current_context() -> Context | None:
    """The context of the actor handling a message on this thread, or ``None``."""
    return getattr(_current, "ctx", None)


def set_message_rank(point: Point | None) -> None:
    """Called by the actor loop around each message: this actor's point in the mesh or
    slice the message was sent to (``None``: its own point in its mesh)."""
    _current.message_rank = point


def context() -> Context:
    """The context of the actor handling the current message on this thread. Outside
    an actor (in the client) the actor instance is the client, at rank ``{}``.
    ``message_rank`` is where this actor appears in what the message was sent to (a
    slice's point, as in Monarch), ``actor_instance.rank`` its place in its own mesh."""
    ctx = getattr(_current, "ctx", None)
    if ctx is None:
        import os

        return Context(ActorInstance("client", _CLIENT_POINT, "client", os.getpid()), _CLIENT_POINT)
    point = getattr(_current, "message_rank", None)
    return ctx if point is None else Context(ctx.actor_instance, point)


def current_actor_name() -> str:
    """A name for the running actor, unique in its cluster: ``PROC_ID.MESH[RANK]``
    (e.g. ``procs1/3.trainers[3]``); ``client`` outside an actor."""
    return context().actor_instance.actor_id


def current_rank() -> Point:
    """This actor's point in the mesh or slice the current message was sent to
    (``context().message_rank``, as in Monarch: a call to ``mesh.slice(gpus=slice(2, 4))``
    runs at ranks 0 and 1; ``.rank`` is the int rank); ``{}`` in the client. Its place in
    its own mesh is ``context().actor_instance.rank``."""
    return context().message_rank


def current_size() -> dict[str, int]:
    """The extent of the mesh or slice the current message was sent to, as a dict (e.g.
    ``{"hosts": 2, "gpus": 8}``); ``{}`` in the client."""
    return dict(context().message_rank.extent)
