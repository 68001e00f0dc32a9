"""The client runtime: what this process keeps as a client, in one object.

One per process (:func:`runtime`), owning

- the mailbox (replies to calls and requests), made on first use;
- supervision (calls to dead actors fail, unhandled failures reach a hook);
- the event bus and the event inbox the hub sends to (log lines and every other hub
  event), started when the process first joins a cluster;
- the forwarded log lines (folding, where they are shown) and the origin put on calls;
- where progress bars go;
- the connected (default) cluster, and the in-process control plane of ``this_proc()``;
- the calls outstanding per actor (``choose()`` balances on them), the calls in flight
  by cell (what a notebook's Ctrl-C interrupts: ``in_flight``) and how to tell that a
  hub is dead (requests to it give up early).

The notebook registers display hooks here (:meth:`ClientRuntime.set_line_sink`,
:meth:`~ClientRuntime.set_bar_factory`, :meth:`~ClientRuntime.set_failure_hook`); a
script keeps the defaults, so both run the same code and differ only in display.

Fork: procs are started by exec (host agents), not fork; a process that forks (a
DataLoader worker) gets, in the child, a runtime with a new mailbox and no event inbox
(the parent's sockets and threads are not the child's), keeping what it knows.
"""

from __future__ import annotations

import itertools
import os
import secrets
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable

from ..errors import MeshFailure
from ..proc import stdio
from ..wire.mailbox import Mailbox
from . import progress
from .events import EventBus, EventReceiver
from .host_routes import HostRoutes
from .in_flight import InFlight
from .logs import Folded, LogLines, print_sink
from .service_registry import ServiceRegistry
from .supervision import Supervision

if TYPE_CHECKING:
    from .control import ControlPlane


class ClientRuntime:
    """This process as a client. Get it with :func:`runtime`."""

    def __init__(self):
        self.client_id = secrets.token_hex(8)  # this process as a client, in every cluster it joins
        self._lock = threading.Lock()
        self._mailbox: Mailbox | None = None
        self._receiver: EventReceiver | None = None
        self.supervision = Supervision(lambda: self.mailbox)
        self.events = EventBus()
        self.events.subscribe(self.supervision.on_event)  # first: calls fail before displays hear of it
        self.lines = LogLines()
        self.bar_factory: progress.BarFactory = progress.terminal_bar
        self.cell = ""  # the notebook cell running now (the notebook names it)
        self.touched = False  # a call was sent since the notebook last reset this (then it flushes logs)
        # The connected cluster (a ``cluster.Cluster``: not imported, cluster imports this
        # module): what this_host() means.
        self.cluster: Any = None
        # Cluster id -> the ``Cluster`` this process is a client of there (started, ephemeral
        # or connected; until it disconnects): the clusters whose lines a cell's end waits for.
        self.attached: dict[str, Any] = {}
        self.cluster_lock = threading.Lock()
        # In a proc: cluster id -> this process's Presence as a client of that cluster's
        # hub, made at its first call there (presence.join_hub). Guarded by presences_lock.
        self.presences: dict[str, Any] = {}
        self.presences_lock = threading.Lock()
        self.local_planes: dict[str, "ControlPlane"] = {}  # this_proc()'s, by its cluster id
        # The handles of each proc mesh, by (cluster id, name), so that a restart updates all of them.
        self.proc_mesh_handles: dict[tuple[str, str], weakref.WeakSet] = {}
        # Calls outstanding from this client per (cluster id, actor mesh) and base rank, shared
        # by every handle and slice of a mesh, so that choose() balances across them.
        self.call_loads: dict[tuple[str, str], dict[int, int]] = {}
        self.call_loads_lock = threading.Lock()
        self.choose_turn = itertools.count()  # round-robin among equally loaded actors
        self.in_flight = InFlight()  # calls waiting on actors, by cell (what Ctrl-C interrupts)
        # hub address -> a function that raises ClusterError once that hub is known dead
        self.hub_liveness: dict[str, Callable[[], None]] = {}
        self.services = ServiceRegistry()  # this client's live services (monarch_nb.service's)
        self.host_routes = HostRoutes(self.local_planes)  # which meshes are called through the host routers

    # what the process receives on ---------------------------------------------------------
    @property
    def mailbox(self) -> Mailbox:
        """This process's mailbox, made on first use."""
        mailbox = self._mailbox
        if mailbox is None:
            with self._lock:
                if self._mailbox is None:
                    self._mailbox = Mailbox()
                mailbox = self._mailbox
        return mailbox

    def event_inbox(self) -> EventReceiver:
        """The inbox the hub sends events and log lines to, started on first use."""
        with self._lock:
            if self._receiver is None:
                self._receiver = EventReceiver(self.events, self.lines)
            return self._receiver

    @property
    def receiving(self) -> bool:
        """Whether this process has bound an inbox yet (then it can't move to another interface)."""
        return self._mailbox is not None or self._receiver is not None

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._mailbox = None
        self._receiver = None

    # calls ---------------------------------------------------------------------------------
    def origin(self) -> str:
        """The origin to put on a call: the call being handled when this runs inside an
        actor (output of nested calls goes to the cell that started it all), else this
        client and the current cell."""
        self.touched = True
        return stdio.call_origin() or f"{self.client_id}:{self.cell}"

    # display hooks (the notebook's) ----------------------------------------------------------
    def set_line_sink(self, sink: Callable[[list[Folded]], None] | None) -> None:
        """Show forwarded actor lines with ``sink(lines)`` (on the event thread, in arrival
        order); ``None``: this process's stdout/stderr."""
        self.lines.sink = sink or print_sink

    def set_bar_factory(self, factory: progress.BarFactory | None) -> None:
        """Make progress bars with ``factory(description, total)`` (returning ``None``: no
        bar); ``None``: a rich bar on an interactive terminal."""
        self.bar_factory = factory or progress.terminal_bar

    def set_failure_hook(self, hook: Callable[[str, MeshFailure, dict | None], None] | None) -> None:
        """See :func:`set_failure_hook`."""
        self.supervision.set_failure_hook(hook)


_runtime: ClientRuntime | None = None
_runtime_lock = threading.Lock()


def runtime() -> ClientRuntime:
    """This process's client runtime, made on first use."""
    current = _runtime
    if current is None:
        current = _make()
    return current


def _make() -> ClientRuntime:
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = ClientRuntime()
        return _runtime


def _after_fork_in_child() -> None:
    global _runtime_lock
    _runtime_lock = threading.Lock()
    if _runtime is not None:
        _runtime._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def set_failure_hook(hook: Callable[[str, MeshFailure, dict | None], None] | None) -> None:
    """Route unhandled failures to ``hook(cluster_id, failure, owner)`` instead of the
    default (raise at the next call on the affected mesh); ``None`` restores the
    default. ``owner`` is the actor (``mesh``, ``rank``) whose child mesh failed, or
    ``None``. The hook runs on the event thread: it must not block."""
    runtime().set_failure_hook(hook)
