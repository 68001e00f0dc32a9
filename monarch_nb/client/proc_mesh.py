"""``ProcMesh``: a handle on worker processes; spawns actor meshes on them."""

from __future__ import annotations

import inspect
import weakref

from ..errors import ActorError, ClusterError, HubTimeout, RemoteFailure
from ..mesh import Extent, Shape
from ..proc.actor import Actor, endpoint_names, owner_of_new_meshes
from ..wire import serialize
from ..wire.mailbox import local_mailbox
from ..wire.remote_error import unpack_exception
from . import logs, progress, supervision, torch_env
from .actor_mesh import ActorMesh
from .mesh_handle import MeshHandle
from .value_mesh import ValueMesh


def _actor_class_info(cls) -> tuple[str, dict[str, bool], list[str]]:
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        what = cls.__name__ if isinstance(cls, type) else repr(cls)
        raise TypeError(f"{what} is not an Actor subclass; declare it as "
                        f"`class {getattr(cls, '__name__', 'MyActor')}(Actor):` "
                        "with `from monarch_nb.actor import Actor`")
    endpoints = endpoint_names(cls)
    methods = [n for n, v in inspect.getmembers(cls, callable) if not n.startswith("_") and n not in endpoints]
    return f"{cls.__module__}.{cls.__qualname__}", endpoints, methods


# The handles of each proc mesh in this process, so that a restart updates all of them.
_handles: dict[tuple[str, str], "weakref.WeakSet[ProcMesh]"] = {}


class ProcMesh(MeshHandle):
    """Worker processes laid out over ``extent``, e.g. ``{"hosts": 1, "gpus": 8}``."""

    def __init__(self, cluster_id: str, hub_address: str, name: str, shape: Shape, procs: list[dict]):
        self._cluster_id = cluster_id
        self._hub_address = hub_address
        self._name = name
        self._shape = shape
        self._procs = procs  # base rank order: proc_id, address, pid, host_id
        _handles.setdefault((cluster_id, name), weakref.WeakSet()).add(self)

    def __reduce__(self):
        return (ProcMesh, (self._cluster_id, self._hub_address, self._name, self._shape, self._procs))

    def slice(self, **dims) -> "ProcMesh":
        """Sub-mesh selected by ``dims`` (see ``ActorMesh.slice``)."""
        return ProcMesh(self._cluster_id, self._hub_address, self._name, self._shape.slice(**dims), self._procs)

    @property
    def pids(self) -> list[int]:
        """OS process ids of this mesh's procs, in rank order."""
        return [self._procs[r]["pid"] for r in self._shape.base_ranks()]

    def spawn(self, name: str, actor_class: type, *args, replace: bool = False,
              init_timeout: float | None = None, **kwargs) -> ActorMesh:
        """Create one ``actor_class(*args, **kwargs)`` in every proc of this mesh; returns
        an :class:`ActorMesh` over the same extent. Blocks until every actor's
        ``__init__`` has returned, showing progress after a second (a bar in a notebook
        or terminal). ``init_timeout`` (seconds, ``None``: no limit): past it the
        constructors still running are interrupted, the mesh is stopped and
        ``TimeoutError`` is raised. Ctrl-C while waiting does the same, raising
        ``KeyboardInterrupt``.

        Spawning a ``name`` that exists returns the live mesh when class and procs match
        (re-running a cell works); otherwise it raises ``ValueError``, unless
        ``replace=True`` stops the old mesh first. Raises ``TypeError`` when
        ``actor_class`` is not an ``Actor`` subclass, ``SerializationError`` when the
        class or arguments can't be pickled, and :class:`ActorError` (with every failed
        rank) when ``__init__`` raised; the mesh is then not created.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"spawn(name, actor_class, ...) needs a mesh name string first, got {name!r}")
        class_name, endpoints, methods = _actor_class_info(actor_class)
        body, buffers = serialize.dumps((actor_class, args, kwargs),
                                        f"{actor_class.__name__} or its constructor arguments")
        bar = progress.Later(f"{name}: {actor_class.__name__}.__init__", len(self), lambda: None)
        try:
            reply = self._spawn_request(name, class_name, endpoints, methods, body, [b.raw() for b in buffers],
                                        replace, getattr(actor_class, "_monarch_main_thread", False),
                                        init_timeout, bar.tick)
        except HubTimeout:
            self._abandon_spawn(name)
            raise TimeoutError(f"{actor_class.__name__}.__init__ did not return within {init_timeout} s on every "
                               f"rank of {name!r}; the actors were interrupted and the mesh stopped") from None
        except KeyboardInterrupt:
            self._abandon_spawn(name)
            raise
        finally:
            bar.close(None)
        if "failures" in reply:
            raise init_error(name, f"{actor_class.__name__}.__init__", reply["failures"], self.extent)
        supervision.sync(name, reply["addresses"], reply.get("dead", {}))  # this_proc: none
        return ActorMesh(self._cluster_id, self._hub_address, name, class_name, endpoints, methods,
                         Shape(Extent(reply["extent"])), reply["addresses"])

    def _spawn_request(self, name, class_name, endpoints, methods, body, buffers, replace, main_thread,
                       timeout, while_waiting) -> dict:
        return self._hub().request(
            "spawn_actors", body, buffers, timeout=timeout, while_waiting=while_waiting, name=name,
            proc_mesh=self._name,
            proc_ranks=self._shape.base_ranks(), extent=dict(self.extent), class_name=class_name,
            endpoints=endpoints, methods=methods, replace=replace, o=logs.origin(), main_thread=main_thread,
            owner=owner_of_new_meshes())

    def _abandon_spawn(self, name: str) -> None:
        """Stop actor mesh ``name`` whose spawn this client gave up on (the hub interrupts
        constructors still running)."""
        try:
            self._hub().request("stop_actors", name=name, timeout=30.0)
        except ClusterError:  # the cluster itself is gone: nothing left to stop
            pass

    def interrupt(self, timeout: float = 5.0) -> None:
        """Raise ``KeyboardInterrupt`` in every endpoint running in this mesh's procs (or
        this slice's): the calls fail with an :class:`ActorError` wrapping it, and the
        actors and procs carry on."""
        mailbox = local_mailbox()
        for rank in self._shape.base_ranks():
            mailbox.request(self._procs[rank]["address"], self._cluster_id, {"op": "interrupt"}, timeout=timeout)

    def setup_torch_distributed(self, backend: str = "gloo", master_addr: str | None = None,
                                master_port: int | None = None) -> ValueMesh:
        """Set what torchrun sets in every proc of this mesh (or slice), so that actors can
        call ``torch.distributed.init_process_group(backend)`` and use DDP: RANK (rank in
        this mesh), WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE (place and count on its
        host, the ``hosts`` dimension), GROUP_RANK and GROUP_WORLD_SIZE (host index and
        count), MASTER_ADDR (default: rank 0's host address) and MASTER_PORT (default: a
        port free on rank 0's host, picked there); GLOO_SOCKET_IFNAME and
        NCCL_SOCKET_IFNAME (unless set) name the interface of the proc's own address.
        Imports no torch. Blocking; returns a ``ValueMesh`` of each rank's variables.

        Safe to re-run: while every proc is already rank r of a live group of this mesh's
        size and ``backend``, nothing changes and the variables that group was made with
        are returned. Raises ``ValueError`` for a backend other than ``"gloo"``/``"nccl"``
        or a bad address or port, :class:`SupervisionError` when a proc of the mesh has
        exited, and :class:`ClusterError` when some procs hold a process group that
        doesn't match (destroy it first) or a proc does not answer in 30 s."""
        return torch_env.setup(self, torch_env.check_backend(backend), master_addr, master_port)

    def restart_failed(self, timeout: float = 120.0) -> list[int]:
        """Start new procs in place of this mesh's failed ones (same host, same rank) and
        re-create every actor that lived on them with its original constructor
        arguments; healthy ranks are untouched (their actors keep their state). Returns
        the restarted base ranks (empty when none had failed). Blocks until the new
        actors' ``__init__`` returned.

        Handles keep working: a restarted actor listens at its old address when it is
        free (else get new handles from ``cluster.actor_meshes``). Raises
        :class:`ClusterError` when procs can't start or ``__init__`` raises again, and
        ``ValueError`` when the mesh was stopped."""
        return restart(self._hub(), self._cluster_id, self._name, None, timeout)["restarted"]

    def _refresh(self) -> None:
        """Take the hub's current procs of this mesh (a restart replaces some)."""
        record = self._hub().request("info", timeout=30.0)["proc_meshes"].get(self._name)
        if record is not None and len(record["procs"]) == len(self._procs):
            self._procs[:] = record["procs"]

    def stop(self) -> None:
        """Stop every proc of this mesh (the whole mesh, also when called on a slice) and
        the actors on them. Blocks until the processes have exited."""
        self._hub().request("stop_procs", name=self._name)

    def __repr__(self) -> str:
        return f"<ProcMesh {self._name!r} {dict(self.extent)}>"


def restart(hub, cluster_id: str, proc_mesh: str, proc_ranks: list[int] | None, timeout: float) -> dict:
    """Ask the hub to restart ``proc_ranks`` of ``proc_mesh`` (None: the failed ones);
    returns its reply (``restarted`` ranks, ``actor_meshes`` records)."""
    local_mailbox().outbox.drop_discarded()  # calls queued for the dead must not reach the new
    reply = hub.request("restart_procs", timeout=timeout, name=proc_mesh, ranks=proc_ranks)
    for name, record in reply["actor_meshes"].items():
        supervision.sync(name, record["addresses"], record["dead"])
        supervision.clear_pending(cluster_id, name)
    for handle in list(_handles.get((cluster_id, proc_mesh), ())):  # every handle here sees the new procs
        handle._procs[:] = reply["proc_mesh"]["procs"]
    if reply["failures"]:  # the first actor mesh's; the procs are stopped, so health shows them all
        name, packed = sorted(reply["failures"].items())[0]
        record = reply["actor_meshes"][name]
        raise init_error(name, f"{record['class_name'].rpartition('.')[2]}.__init__ (restarting)", packed,
                         Extent(record["extent"]))
    return reply


def init_error(mesh: str, what: str, packed: dict, extent: Extent) -> ActorError:
    """The :class:`ActorError` for actors whose ``__init__`` raised (``packed``: rank ->
    the exception as the proc packed it)."""
    failures = []
    for rank, frames in sorted(packed.items()):
        exc, tb = unpack_exception(serialize.loads(frames))
        failures.append(RemoteFailure(extent.point(int(rank)), exc, tb))
    return ActorError(mesh, what, failures, extent.nelements)
