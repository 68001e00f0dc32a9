"""``ActorMesh``: a handle on actors spawned over a proc mesh (or a slice of one).

A handle is plain data (cluster id, hub address, actor addresses, shape), so it can
be passed to other actors, which then call it from their own endpoints.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Generic, TypeVar, cast

from ..errors import SupervisionError
from ..mesh import Shape
from .endpoint import Endpoint
from .future import Future
from .mesh_handle import MeshHandle
from .runtime import runtime

A = TypeVar("A")
F = TypeVar("F", bound=Callable[..., Any])

# ActorMesh attributes that Monarch's ActorMesh lacks: an endpoint of the same name wins
# over them, so a Monarch actor with an endpoint ``name`` or ``restart`` keeps working.
# An endpoint named like any other attribute (size, stop, slice, ...) is refused at spawn,
# as Monarch refuses it (see ``hidden_endpoints``).
YIELDING_TO_ENDPOINTS = frozenset({"name", "restart"})


# In a mesh's outstanding-call counts (ActorMesh._load): the calls over every actor of it.
_EVERY = -1


def _count(load: dict[int, int], ranks, change: int) -> None:
    """Add ``change`` to the outstanding calls of each of ``ranks`` (the caller holds the
    counts' lock; the loop in a function of its own: see monarch_nb.wire.interrupts)."""
    for rank in ranks:
        load[rank] = load.get(rank, 0) + change


def hidden_endpoints(endpoints: dict[str, bool]) -> list[str]:
    """The endpoints of ``endpoints`` that an ``ActorMesh`` attribute would hide."""
    return sorted(n for n in endpoints if hasattr(ActorMesh, n) and n not in YIELDING_TO_ENDPOINTS)


class _YieldsToEndpoint:
    """A method of ``ActorMesh`` that an endpoint of the same name replaces on meshes
    whose actors have one (``YIELDING_TO_ENDPOINTS``)."""

    def __init__(self, method: Callable[..., Any]):
        self._method = method
        self.__doc__ = method.__doc__
        self.__name__ = method.__name__

    def __get__(self, mesh: "ActorMesh | None", owner: type | None = None) -> Any:
        if mesh is not None and self.__name__ in mesh._endpoints:
            return Endpoint(mesh, self.__name__)
        return self._method.__get__(mesh, owner)


def _yields_to_endpoint(method: F) -> F:
    return cast(F, _YieldsToEndpoint(method))


class ActorMesh(MeshHandle, Generic[A]):
    """Actors of one class over ``extent``; ``mesh.ENDPOINT.call(...)`` reaches them.

    ``len(mesh)`` is the number of actors; ``mesh.slice(gpus=slice(0, 4))`` a sub-mesh.
    ``ActorMesh[MyActor]`` names the actor class in type hints, as in Monarch.
    """

    def __init__(self, cluster_id: str, hub_address: str, proc_mesh: str, name: str, class_name: str,
                 endpoints: dict[str, bool], methods: list[str], shape: Shape, addresses: list[str]):
        self._cluster_id = cluster_id
        self._hub_address = hub_address
        self._proc_mesh_name = proc_mesh  # names are unique per proc mesh: both identify the mesh
        self._name = name
        self._class_name = class_name
        self._endpoints = endpoints
        self._methods = methods
        self._shape = shape
        self._addresses = addresses

    def __reduce__(self):
        return (ActorMesh, (self._cluster_id, self._hub_address, self._proc_mesh_name, self._name,
                            self._class_name, self._endpoints, self._methods, self._shape, self._addresses))

    @property
    def name(self) -> str:
        """The mesh's name; on a mesh whose actors have an endpoint ``name``, that endpoint
        (Monarch's ActorMesh has no ``name``)."""
        if "name" in self._endpoints:
            return cast(str, Endpoint(self, "name"))
        return self._name

    # geometry ------------------------------------------------------------------------
    def slice(self, **dims) -> "ActorMesh":
        """The sub-mesh selected by ``dims``: an int picks one index and drops the
        dimension, a ``slice`` keeps it. Raises ``ValueError`` for an unknown dimension,
        ``IndexError`` for an out-of-range index."""
        return self._with_shape(self._shape.slice(**dims))

    def flatten(self, name: str) -> "ActorMesh[A]":
        """The same actors over one dimension ``name`` (in rank order), e.g. extent
        ``{"hosts": 2, "gpus": 4}`` becomes ``{name: 8}``. Raises ``ValueError`` for a
        slice whose actors one stride can't describe."""
        return self._with_shape(self._shape.flatten(name))

    def _with_shape(self, shape: Shape) -> "ActorMesh":
        """This mesh's actors viewed over ``shape`` (a slice, or the same ranks reshaped)."""
        return ActorMesh(self._cluster_id, self._hub_address, self._proc_mesh_name, self._name, self._class_name,
                         self._endpoints, self._methods, shape, self._addresses)

    @property
    def initialized(self) -> Future[bool]:
        """A finished ``Future`` (as in Monarch, where it waits for the actors to exist;
        here ``spawn`` has already waited for every ``__init__``): ``True``, or raising
        :class:`SupervisionError` with the report of each actor of this view that is
        known gone (its ``__init__`` raised, or it died since). Never blocks."""
        rt = runtime()
        gone = [why for base in self._shape.base_ranks()
                if (why := rt.supervision.why_dead(self._cluster_id, self._addresses[base], self._name, base))]
        future: Future[bool] = Future(rt, f"{self._name}.initialized")
        error = SupervisionError(f"actor mesh {self._name!r}: {len(gone)} of {len(self)} actors are gone:\n"
                                 + "\n".join(gone)) if gone else None
        future._resolve(True, error)
        return future

    # endpoints -----------------------------------------------------------------------
    def __getattr__(self, name: str) -> Endpoint[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._endpoints:
            return Endpoint(self, name)
        known = ", ".join(sorted(self._endpoints)) or "none"
        if name in self._methods:
            raise AttributeError(
                f"{self._class_name}.{name} is not an endpoint; decorate it with @endpoint to call "
                f"it remotely (endpoints: {known})")
        raise AttributeError(f"{self._class_name} has no endpoint {name!r} (endpoints: {known})")

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._endpoints))

    def _track(self, base: list[int], future: "Future") -> None:
        """Count ``future`` as outstanding on the actors of base ranks ``base`` until it is
        done (for choose). A call over every actor of the mesh is counted once, for all
        (``_EVERY``), not once per actor: that was two loops over the mesh per call."""
        lock, load = self._load()
        ranks = (_EVERY,) if len(base) == len(self._addresses) else base
        with lock:
            _count(load, ranks, 1)

        def done(_):
            with lock:
                _count(load, ranks, -1)

        future.add_done_callback(done)

    def _least_loaded(self) -> int | None:
        """View rank of a live actor with the fewest outstanding calls from this process,
        round-robin among equals; ``None`` when every actor of the view is known dead
        (supervision has reported it)."""
        rt = runtime()
        lock, load = self._load()
        with lock:  # the loop in a function of its own: see monarch_nb.wire.interrupts
            counts = self._live_loads(load)
        if not counts:
            return None
        low = min(counts.values())
        candidates = [r for r, n in counts.items() if n == low]
        return candidates[next(rt.choose_turn) % len(candidates)]

    def _live_loads(self, load: dict[int, int]) -> dict[int, int]:
        """View rank -> outstanding calls, of the actors of the view not known dead."""
        supervision = runtime().supervision
        every = load.get(_EVERY, 0)
        return {view: every + load.get(base, 0) for view, base in enumerate(self._shape.base_ranks())
                if supervision.why_dead(self._cluster_id, self._addresses[base], self._name, base) is None}

    def _load(self) -> tuple[threading.Lock, dict[int, int]]:
        """The lock and the outstanding-call counts (base rank -> calls) of this mesh in
        this client (the runtime's, shared by every handle and slice)."""
        rt = runtime()
        with rt.call_loads_lock:
            return rt.call_loads_lock, rt.call_loads.setdefault((self._cluster_id, self._key), {})

    @property
    def _key(self) -> str:
        """The mesh's key in its cluster's registry: ``PROC_MESH/NAME``."""
        return f"{self._proc_mesh_name}/{self._name}"

    # lifecycle -----------------------------------------------------------------------
    def _gone_ranks(self) -> list[int]:
        """The view ranks whose actor this client knows gone (``Supervision.why_dead``)."""
        supervision = runtime().supervision
        return [r for r, base in enumerate(self._shape.base_ranks_of(list(range(len(self)))))
                if supervision.why_dead(self._cluster_id, self._addresses[base], self._name, base) is not None]

    @_yields_to_endpoint
    def restart(self, ranks: list[int] | None = None, timeout: float = 120.0) -> list[int]:
        """Restart the procs under ``ranks`` of this mesh (view ranks of this handle;
        default: those whose actor is known gone, its proc dead or not, or if none, every
        failed proc of its proc mesh) and re-create the actors that lived on them, of this
        and any other mesh, from their original constructor arguments. Live procs named
        in ``ranks`` are stopped first (their pending calls fail with
        ``SupervisionError``); other ranks are untouched. Returns the restarted proc
        ranks. Blocks until the actors are constructed again; see
        ``ProcMesh.restart_failed`` for the errors (on ``this_proc()``:
        :class:`InvalidRequest` at once). On a mesh whose actors have an endpoint
        ``restart``, ``mesh.restart`` is that endpoint and ``ActorMesh.restart(mesh)`` this."""
        control = self._control()
        record = control.actor_mesh_record(self._proc_mesh_name, self._name)
        if record is None:
            raise ValueError(f"actor mesh {self._name!r} was stopped; spawn it again")
        proc_ranks = None
        if ranks is None:
            ranks = self._gone_ranks() or None
        if ranks is not None:
            if isinstance(ranks, (str, bytes)) or not all(isinstance(r, int) for r in ranks):
                raise TypeError(f"restart(ranks=...) takes a list of int ranks, not {ranks!r}")
            bad = [r for r in ranks if not 0 <= r < len(self)]
            if bad:
                raise IndexError(f"{self._name} has ranks 0-{len(self) - 1} in this view, not {bad}")
            proc_ranks = [record["proc_ranks"][b] for b in self._shape.base_ranks_of(ranks)]
        reply = control.restart_procs(record["proc_mesh"], proc_ranks, timeout)
        self._addresses[:] = reply["actor_meshes"][self._key]["addresses"]  # this handle and its slices
        return reply["restarted"]

    def stop(self, reason: str = "stopped by client") -> "Future[None]":
        """Stop every actor of this mesh (the whole mesh, also when called on a slice).
        Calls still queued are not run; one running is interrupted (KeyboardInterrupt at
        its next Python line). Runs at once and blocks until done, returning a finished
        ``Future[None]`` (to ``await`` or ``get()`` as in Monarch; ``reason`` is accepted
        for Monarch compatibility). Warns (``RuntimeWarning``) naming the
        ranks still running an endpoint about 2 s later (a blocking C call, or code that
        catches KeyboardInterrupt): their threads end with the proc mesh."""
        stuck = self._control().stop_actors(self._proc_mesh_name, self._name)
        if stuck:
            running = ", ".join(f"rank {s['rank']} in {s['running'] or 'its __init__'}" for s in stuck)
            warnings.warn(f"actor mesh {self._name!r} was stopped, but {running} did not return after an "
                          "interrupt (a blocking call, or code that catches KeyboardInterrupt); its thread "
                          "ends when its proc mesh stops", RuntimeWarning, stacklevel=2)
        return Future.finished(runtime(), f"{self._name}.stop")

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name!r} {self._class_name} {dict(self.extent)}>"
