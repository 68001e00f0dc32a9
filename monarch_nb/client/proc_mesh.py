"""``ProcMesh``: a handle on worker processes; spawns actor meshes on them."""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import weakref
from typing import Any, Callable, TypeVar, cast

from ..errors import ActorError, ClusterError, HubTimeout
from ..mesh import Extent, Shape
from ..proc.actor import Actor, endpoint_names, owner_of_new_meshes
from ..proc.setup_actor import ProcSetup, set_root_log_level
from ..protocol import hub_ops, proc_ops
from ..wire import frames as wire_frames
from ..wire import serialize, sockets
from . import progress, workspace_sync
from .actor_mesh import ActorMesh, hidden_endpoints
from .control import abandon_spawn, init_error
from .future import FinishedCoroutine, Future
from .host_routes import may_route
from .mesh_handle import MeshHandle
from .runtime import runtime
from .spawn_digest import spawn_digests
from .value_mesh import ValueMesh

T = TypeVar("T", bound=Actor)


# How long spawn waits for the hub's news of an __init__ failure to reach the failure hooks.
INIT_FAILURE_HEARD_S = 5.0

def _actor_class_info(cls) -> tuple[str, dict[str, bool], list[str]]:
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        what = cls.__name__ if isinstance(cls, type) else repr(cls)
        raise TypeError(f"{what} is not an Actor subclass; declare it as "
                        f"`class {getattr(cls, '__name__', 'MyActor')}(Actor):` "
                        "with `from monarch_nb.actor import Actor`")
    endpoints = endpoint_names(cls)
    if len(set(endpoints.values())) > 1:  # Monarch's rule: a sync endpoint that waits would block the async ones
        sync = sorted(n for n, a in endpoints.items() if not a)
        asynchronous = sorted(n for n, a in endpoints.items() if a)
        raise ValueError(f"{cls.__name__} mixes both async and sync endpoints: sync {', '.join(sync)}; async "
                         f"{', '.join(asynchronous)}; make them all `def` or all `async def` (as Monarch requires)")
    hidden = hidden_endpoints(endpoints)
    if hidden:  # Monarch refuses these too; better here than a mesh whose endpoint can't be reached
        raise ValueError(f"{cls.__name__} has endpoint(s) named like ActorMesh attributes: "
                         + "; ".join(f"mesh.{n} would be ActorMesh.{n}, not the endpoint {cls.__name__}.{n}"
                                     for n in hidden)
                         + "; rename the endpoint(s) (as Monarch requires)")
    methods = [n for n, v in inspect.getmembers(cls, callable) if not n.startswith("_") and n not in endpoints]
    return f"{cls.__module__}.{cls.__qualname__}", endpoints, methods


def _connect_announced(outbox: sockets.Outbox, cluster_id: bytes,
                       spawner: int) -> Callable[[wire_frames.Message], None]:
    """A reply-port callback that connects the spawning thread to each new actor as it
    tells where it is (``proc_ops.ANNOUNCE``), while the other constructors run: the
    handshakes of 256 actors made after the spawn held up its first call ~100 ms. The
    sockets are the thread's own (``Outbox``): an announce dispatched on another thread
    (one that drives the mailbox meanwhile) is left to the connect after the spawn."""
    def connect(message: wire_frames.Message) -> None:
        address = message.header.get(proc_ops.ADDRESS)
        if isinstance(address, str) and threading.get_ident() == spawner:
            outbox.connect([address], cluster_id)

    return connect


class ProcMesh(MeshHandle):
    """Worker processes laid out over ``extent``, e.g. ``{"gpus": 8}`` (one host) or
    ``{"hosts": 2, "gpus": 8}``."""

    def __init__(self, cluster_id: str, hub_address: str, name: str, shape: Shape, procs: list[dict]):
        self._cluster_id = cluster_id
        self._hub_address = hub_address
        self._name = name
        self._shape = shape
        self._procs = procs  # base rank order: proc_id, address, pid, host_id
        self._setup_error: BaseException | None = None  # what spawn_procs(bootstrap=...) raised
        runtime().proc_mesh_handles.setdefault((cluster_id, name), weakref.WeakSet()).add(self)

    def __reduce__(self):
        return (ProcMesh, (self._cluster_id, self._hub_address, self._name, self._shape, self._procs))

    def slice(self, **dims) -> "ProcMesh":
        """Sub-mesh selected by ``dims`` (see ``ActorMesh.slice``)."""
        return ProcMesh(self._cluster_id, self._hub_address, self._name, self._shape.slice(**dims), self._procs)

    @property
    def initialized(self) -> Future[bool]:
        """A finished ``Future``: ``True``, or raising the :class:`ActorError` of the
        ``bootstrap`` given to ``spawn_procs`` when it raised on some procs (as in
        Monarch, where that is where a bootstrap failure shows)."""
        future: Future[bool] = Future(runtime(), f"{self._name}.initialized")
        future._resolve(True, self._setup_error)
        return future

    @property
    def pids(self) -> list[int]:
        """OS process ids of this mesh's procs, in rank order."""
        return [self._procs[r]["pid"] for r in self._shape.base_ranks()]

    def spawn(self, name: str, actor_class: type[T], *args: Any, replace: bool = False,
              init_timeout: float | None = None, raise_init_errors: bool = False, **kwargs: Any) -> T:
        """Create one ``actor_class(*args, **kwargs)`` in every proc of this mesh; returns
        an :class:`ActorMesh` over the same extent (which a type checker sees as an
        ``actor_class``, as in Monarch, so that it checks ``mesh.ENDPOINT.call(...)``
        against the method: see ``Actor``). Blocks until every actor's
        ``__init__`` has returned, showing progress after a second (a bar in a notebook
        or terminal). ``init_timeout`` (seconds, ``None``: no limit): past it the
        constructors still running are interrupted, the mesh is stopped and
        ``TimeoutError`` is raised (``ValueError`` at once for an ``init_timeout`` that is
        not > 0). Ctrl-C while waiting does the same, raising ``KeyboardInterrupt``.

        An ``__init__`` that raises is a supervision fault, as in Monarch: the mesh is
        returned, calls to the failed ranks raise :class:`SupervisionError`, and the
        failure (a :class:`MeshFailure` of kind ``actor_failed``) goes to the owning
        actor's ``__supervise__`` or, for a mesh the client spawned, to the unhandled
        failure hooks (in a notebook: shown under the running cell) before this returns.
        With ``raise_init_errors=True`` the spawn instead raises :class:`ActorError`
        (with every failed rank) and the mesh is not created.

        Spawning a ``name`` that exists returns the live mesh when this spawn would make
        the same one (its procs, class, the class's code and the constructor arguments:
        re-running a cell works, in a restarted kernel too; ``client.spawn_digest``);
        otherwise it raises ``ValueError`` saying what differs, unless ``replace=True``
        stops the old mesh first. Raises ``TypeError`` when ``actor_class`` is not an
        ``Actor`` subclass, ``SerializationError`` when the class or arguments can't be
        pickled.
        """
        return self._spawn(name, actor_class, args, kwargs, replace, init_timeout, raise_init_errors)

    def _spawn(self, name: str, actor_class: type[T], args: tuple, kwargs: dict, replace: bool = False,
               init_timeout: float | None = None, raise_init_errors: bool = False,
               same_construction: bool = True) -> T:
        """:meth:`spawn`; ``same_construction=False``: a live mesh of that name is returned
        whatever code and arguments it was made from (controllers: any client's
        ``get_or_spawn_controller`` gets the one there is)."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"spawn(name, actor_class, ...) needs a mesh name string first, got {name!r}")
        if init_timeout is not None and not init_timeout > 0:  # (NaN too)
            raise ValueError(f"spawn(init_timeout={init_timeout!r}): give the seconds each __init__ may take, "
                             "a number > 0, or None for no limit")
        class_name, endpoints, methods = _actor_class_info(actor_class)
        body, buffers = serialize.dumps((actor_class, args, kwargs),
                                        f"{actor_class.__name__} or its constructor arguments")
        rt = runtime()
        control = self._control()
        bar = progress.Later(rt.bar_factory, f"{name}: {actor_class.__name__}.__init__", len(self), lambda: None)
        fields = dict(extent=dict(self.extent), class_name=class_name, endpoints=endpoints, methods=methods,
                      replace=replace, raise_init_errors=raise_init_errors, o=rt.origin(),
                      **{hub_ops.SPAWN_DIGESTS: spawn_digests(actor_class, args, kwargs,
                                                              len(body) + sum(b.raw().nbytes for b in buffers))
                         if same_construction else None},
                      main_thread=getattr(actor_class, "_monarch_main_thread", False), owner=owner_of_new_meshes())
        host_ids = {str(p.get("host_id")) for p in self._procs}
        routed = may_route(len(self), len(host_ids), lambda: control.machines(host_ids))
        announced = None
        if routed:  # each actor connects to its host's router, and it to the actor, while __init__ runs
            fields[hub_ops.ROUTED] = True
        else:  # the first call's connections, both ways, made while __init__ runs
            fields[proc_ops.CALLER] = rt.mailbox.address
            announced = fields[proc_ops.ANNOUNCE] = rt.mailbox.open_port(
                _connect_announced(rt.mailbox.outbox, self._cluster_id.encode(), threading.get_ident()))
        ran = None  # constructors that returned (or raised): every one once the hub replies
        try:
            reply = control.spawn_actors(self._name, self._shape.base_ranks(), name, fields, body,
                                         [b.raw() for b in buffers], init_timeout, bar.tick)
            ran = len(self)
        except HubTimeout:
            abandon_spawn(control, self._name, name)
            raise TimeoutError(f"{actor_class.__name__}.__init__ did not return within {init_timeout} s on every "
                               f"rank of {name!r}; the actors were interrupted and the mesh stopped") from None
        except KeyboardInterrupt:
            abandon_spawn(control, self._name, name)
            raise
        finally:
            bar.close(ran)
            if announced is not None:
                rt.mailbox.close_port(announced)
        stopped = rt.supervision.stopped_why(self._cluster_id)
        if stopped is not None:  # while the constructors ran: the hub's answer names actors that are gone
            raise ClusterError(stopped)
        if "failures" in reply:
            raise init_error(name, f"{actor_class.__name__}.__init__", reply["failures"], self.extent)
        rt.supervision.sync(self._cluster_id, reply["addresses"], reply["dead"], reply["name"])
        if not routed:  # those not announced in time (made while the caller moves on)
            rt.mailbox.outbox.connect([a for rank, a in enumerate(reply["addresses"]) if str(rank) not in reply["dead"]],
                                      self._cluster_id.encode())
        if reply.get(hub_ops.INIT_FAILED) and fields["owner"] is None:  # said by the failure hooks before returning
            rt.supervision.wait_heard(self._cluster_id, reply["name"], INIT_FAILURE_HEARD_S)
        # (an actor spawning a name another owner's mesh has gets its own, under its own name)
        mesh: ActorMesh[T] = ActorMesh(self._cluster_id, self._hub_address, self._name, reply["name"], class_name,
                                       endpoints, methods, Shape(Extent(reply["extent"])), reply["addresses"])
        return cast(T, mesh)

    def sync_workspace(self, reload: bool = True, timeout: float = workspace_sync.TIMEOUT_S) -> dict:
        """Bring every proc of this mesh up to date with this client's workspace (the
        ``.py`` files under its working directory; hidden folders, virtual environments
        and caches left out), as Monarch's ``sync_workspace``: a proc whose copy differs
        (another host) gets the changed files; then, with ``reload``, every proc reloads
        the modules whose files changed, and live actors of a reloaded class continue
        with the new class's code (their state kept). So a fix to a training function
        reaches the running cluster without new procs.

        Blocking. Returns ``{"files": n, "sent": {rank: [paths]}, "reloaded": [modules],
        "swapped": [actor meshes], "problems": [text]}``; what could not be reloaded (a
        module that fails to import again, an actor whose class is gone from it) is in
        ``problems`` and keeps its old code. A reloaded module's top-level code runs
        on each proc's control thread: one that blocks holds that proc's control
        (``health()`` shows it unresponsive until it returns). Raises ``ValueError`` for a working
        directory that is not a workspace (too many or too large files),
        :class:`SupervisionError` when a proc of the mesh has exited, and
        :class:`ClusterError` when one does not answer within ``timeout`` seconds."""
        return workspace_sync.sync(self, reload, timeout)

    def interrupt(self, timeout: float = 5.0) -> None:
        """Raise ``KeyboardInterrupt`` in every endpoint running in this mesh's procs (or
        this slice's): the calls fail with an :class:`ActorError` wrapping it, and the
        actors and procs carry on. Waits up to ``timeout`` seconds for the procs to
        confirm. On ``this_proc()`` only the actors' threads are interrupted, never the
        client's own."""
        self._control().interrupt([self._procs[r] for r in self._shape.base_ranks()], timeout)

    def setup_torch_distributed(self, backend: str = "auto", master_addr: str | None = None,
                                master_port: int | None = None) -> ValueMesh:
        """Set what torchrun sets in every proc of this mesh (or slice), so that actors can
        call ``torch.distributed.init_process_group(backend)`` and use DDP: RANK (rank in
        this mesh), WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE (place and count on its
        host, the ``hosts`` dimension), GROUP_RANK and GROUP_WORLD_SIZE (host index and
        count), MASTER_ADDR (default: rank 0's host address) and MASTER_PORT (default: a
        port free on rank 0's host, picked there); GLOO_SOCKET_IFNAME and
        NCCL_SOCKET_IFNAME (unless set) name the interface of the proc's own address.
        Blocking; returns a ``ValueMesh`` of each rank's variables.

        ``backend="auto"`` (default) is NCCL when every proc has a CUDA device, else
        gloo. Unless ``backend="gloo"``, when every proc has a CUDA device each one's
        current device is set (device 0 of a proc bound to one GPU by ``spawn_procs``,
        else its LOCAL_RANK's), and ``ValueError`` names the ranks when two would share
        one GPU, which NCCL refuses ("Duplicate GPU detected"). Imports no torch on a
        proc that sees no GPU.

        Safe to re-run: while every proc is already rank r of a live group of this mesh's
        size and ``backend``, nothing changes and the variables that group was made with
        are returned. Raises ``ValueError`` for a backend other than ``"gloo"``/``"nccl"``/``"auto"``
        or a bad address or port, :class:`SupervisionError` when a proc of the mesh has
        exited, and :class:`ClusterError` when some procs hold a process group that
        doesn't match (destroy it first) or a proc does not answer in 30 s. Then call
        ``init_process_group()`` in the actors: without a backend, torch takes NCCL for
        CUDA tensors and gloo for CPU ones."""
        from . import torch_env  # (with its first use: a client that connects does not load it)

        return torch_env.setup(self, torch_env.check_backend(backend), master_addr, master_port)

    def restart_failed(self, timeout: float = 120.0) -> list[int]:
        """Start new procs in place of this mesh's failed ones (same host, same rank) and
        re-create every actor that lived on them with its original constructor
        arguments; healthy ranks are untouched (their actors keep their state). Returns
        the restarted base ranks (empty when none had failed). Blocks until the new
        actors' ``__init__`` returned.

        Handles keep working: a restarted actor listens at its old address when it is
        free (else get new handles from ``cluster.actor_meshes``). Raises
        :class:`ClusterError` when procs can't start, ``ValueError`` when the mesh was
        stopped, and :class:`InvalidRequest` at once on ``this_proc()`` (the client
        itself can't be restarted). An ``__init__`` that raises again fails that actor
        only (the procs and their other meshes are back): the restart then raises its
        :class:`ActorError`, naming the meshes back and what to do with the broken one."""
        return self._control().restart_procs(self._name, None, timeout)["restarted"]

    def logging_option(self, stream_to_client: bool = True, aggregate_window_sec: int | None = None,
                       level: int = logging.INFO) -> Future[None]:
        """Monarch's switch for the procs' output. ``level`` becomes the level of the
        root logger in every proc of this mesh (so ``logging.info`` in actors shows at
        ``logging.INFO``). monarch_nb always shows the output a call caused under the
        cell (or in the terminal) that made it, complete when the call returns, and
        keeps every line in the hub's log store (``cluster.logs()``): the streaming
        options are checked and change nothing. Raises ``ValueError`` for
        ``aggregate_window_sec`` without ``stream_to_client`` (as Monarch does). Blocks
        until every proc has the level; returns a finished ``Future[None]`` that is a
        coroutine too (Monarch's is ``async def``: awaited, or given to ``asyncio.run``)."""
        if aggregate_window_sec is not None and not stream_to_client:
            raise ValueError("aggregate_window_sec needs stream_to_client=True")
        self._run_setup(None, 1, functools.partial(set_root_log_level, level))
        return FinishedCoroutine.finished(runtime(), f"{self._name}.logging_option")

    def _run_setup(self, proc_bind: list[dict[str, str]] | None, procs_per_host: int,
                   bootstrap: Callable[[], object] | None) -> None:
        """Run :class:`ProcSetup` once in every proc of this mesh (see
        ``HostMesh.spawn_procs``); keep what ``bootstrap`` raised for :attr:`initialized`."""
        try:
            self.spawn("proc_setup", ProcSetup, proc_bind, procs_per_host, bootstrap, raise_init_errors=True).stop()
        except ActorError as e:
            self._setup_error = e

    def _refresh(self) -> None:
        """Take the hub's current procs of this mesh (a restart replaces some)."""
        record = self._control().proc_mesh_record(self._name)
        if record is not None and len(record["procs"]) == len(self._procs):
            self._procs[:] = record["procs"]

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every proc of this mesh (the whole mesh, also when called on a slice) and
        the actors on them. Runs at once and blocks until the processes have exited
        (unlike Monarch, where nothing happens until the future is awaited); returns a
        finished ``Future[None]`` so that ``await procs.stop()`` and
        ``procs.stop().get()`` work as in Monarch. ``reason`` is accepted for Monarch
        compatibility (the procs' failures say "was stopped")."""
        self._control().stop_procs(self._name)
        for proc in self._procs:  # (the hub tells every client of the actors: Supervision.actors_gone)
            sockets.Outbox.discard(proc["address"])
        return Future.finished(runtime(), f"{self._name}.stop")

    def __repr__(self) -> str:
        return f"<ProcMesh {self._name!r} {dict(self.extent)}>"

