"""The endpoint calls this client is waiting on, by the cell that made them: what a
Ctrl-C in the notebook interrupts on the cluster.

``Endpoint`` registers each call it sends with :meth:`InFlight.add`; the call leaves
the registry when its future is done. :func:`interrupt` raises ``KeyboardInterrupt``
in those calls where they run and has the actors refuse those not begun yet (only
those calls: other calls of the same actors run normally).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ClusterError
from ..mesh.ranks import format_ranks

# "ActorMesh" and "Future" in annotations name ``actor_mesh.ActorMesh`` and
# ``future.Future``, not imported: both lead back here (through ``endpoint`` and the
# runtime), and a cycle, even for type checkers only, is one the layers forbid.


@dataclass(frozen=True)
class Call:
    """One call in flight: on which mesh, from which cell, where its replies go
    (``(address, port)``: names the call to its actors) and which of its actors (base
    ranks of the mesh) have not answered yet. ``router``: for a call sent through the
    host routers (``host.router``), the router of a base rank: its actors know the call
    by ``(router, route)``, the reply route the router gave it."""

    mesh: "ActorMesh"
    endpoint: str
    cell: str
    route: tuple[str, int]
    outstanding: Callable[[], list[int]]
    router: Callable[[int], str] | None = None


class InFlight:
    """The calls in flight from this process (thread-safe: replies end them on the
    thread that dispatches them)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._calls: dict[int, Call] = {}
        # The futures the main thread waits on now (by id): a cell that waits on calls an
        # earlier cell made is interrupted on them too (``Future.get`` and ``await`` add and remove;
        # one whose wait a KeyboardInterrupt ended stays until the call ends, or the
        # cell's interrupt handler took it: ``forget_waited``).
        self.waited: set[int] = set()

    def add(self, future: "Future", call: Call) -> None:
        """Keep ``call`` until ``future`` is done."""
        key = id(future)
        with self._lock:
            self._calls[key] = call

        def done(_) -> None:
            with self._lock:
                self._calls.pop(key, None)
            self.waited.discard(key)

        future.add_done_callback(done)

    def forget_waited(self) -> None:
        """Forget which futures were waited on (a cell's Ctrl-C has been handled)."""
        self.waited.clear()

    def of_cell(self, cell: str) -> list[Call]:
        """The calls that still wait on an actor and that notebook cell ``cell`` made, or
        that the main thread waits on now (made in an earlier cell: ``fs = [...]`` in
        one, ``[f.get() for f in fs]`` in the next)."""
        with self._lock:
            calls = list(self._calls.items())  # no loop under the lock: see monarch_nb.wire.interrupts
        waited = self.waited
        return [c for key, c in calls if (c.cell == cell or key in waited) and c.outstanding()]


def _by_mesh(calls: list[Call]) -> list[tuple["ActorMesh", dict[int, list[tuple[str, int]]], str]]:
    """``calls`` grouped by actor mesh: (mesh, base rank -> routes of the calls that
    rank still runs, a description such as ``"trainers.step (ranks 0-3)"``)."""
    by_mesh: dict[tuple, tuple["ActorMesh", dict[int, list], set[str]]] = {}
    for call in calls:
        mesh = call.mesh
        _, routes, endpoints = by_mesh.setdefault((mesh._cluster_id, mesh._proc_mesh_name, mesh._name),
                                                  (mesh, {}, set()))
        for rank in call.outstanding():
            routes.setdefault(rank, []).append(call.route if call.router is None else (call.router(rank), call.route))
        endpoints.add(call.endpoint)
    return [(mesh, routes, f"{mesh._name}.{'/'.join(sorted(endpoints))} (ranks {format_ranks(sorted(routes))})")
            for mesh, routes, endpoints in by_mesh.values()]


def describe(calls: list[Call]) -> list[str]:
    """One description per mesh, e.g. ``"trainers.step (ranks 0-3)"``."""
    return [what for _, _, what in _by_mesh(calls)]


def interrupt(calls: list[Call], timeout: float = 5.0) -> list[str]:
    """Interrupt ``calls`` where they still run (``ControlPlane.interrupt_calls``: each
    then fails with an ``ActorError`` wrapping ``KeyboardInterrupt``; the actors carry
    on, and calls of theirs not yet begun are refused). The meshes of one cluster are
    asked at once and get ``timeout`` seconds together for their procs to confirm.
    Returns :func:`describe`'s descriptions; a mesh whose cluster can't be reached has
    the reason added, and one whose procs did not all confirm says how many did not."""
    meshes_of_calls = _by_mesh(calls)
    by_cluster: dict[str, tuple[Any, list[tuple["ActorMesh", dict[int, list], str]]]] = {}
    for mesh, routes, what in meshes_of_calls:
        if mesh._cluster_id not in by_cluster:
            by_cluster[mesh._cluster_id] = (mesh._control(), [])
        by_cluster[mesh._cluster_id][1].append((mesh, routes, what))
    said: dict[str, str] = {}
    for control, meshes in by_cluster.values():
        try:
            unconfirmed = control.interrupt_calls([(m._proc_mesh_name, m._name, routes) for m, routes, _ in meshes],
                                                  timeout)
        except ClusterError as e:
            said.update((what, f"{what} not reached: {e}") for _, _, what in meshes)
            continue
        for (_, _, what), missed in zip(meshes, unconfirmed):
            said[what] = what + (f" ({missed} proc(s) did not confirm within {timeout:g} s)" if missed else "")
    return [said[what] for _, _, what in meshes_of_calls]
