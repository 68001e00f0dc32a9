"""The control plane as mesh handles see it: spawn and stop actors, stop and restart
procs, interrupt, and the registry records they need.

Two implementations: ``hub_client.HubControl`` (a cluster's hub, and the procs
themselves for interrupts) and ``local_proc.LocalControl`` (``this_proc()``: the client
process itself, with no hub). Every op either works or raises at once: an op that makes
no sense for ``this_proc()`` raises :class:`InvalidRequest` saying what to do instead.

This module is the interface and the helpers both use; it imports nothing else of the
client, so the runtime and mesh handles can name it without an import cycle.
"""

from __future__ import annotations

import abc
from typing import Callable

from ..errors import ActorError, ClusterError, RemoteFailure
from ..mesh import Extent
from ..wire import serialize
from ..wire.remote_error import unpack_exception


class ControlPlane(abc.ABC):
    """What a mesh handle asks of the thing that runs its cluster."""

    @abc.abstractmethod
    def spawn_actors(self, proc_mesh: str, proc_ranks: list[int], name: str, fields: dict, body: bytes,
                     buffers: list, timeout: float | None, while_waiting: Callable[[], None]) -> dict:
        """Construct actor mesh ``name`` on ``proc_ranks`` of ``proc_mesh``; ``fields`` as
        the hub's ``spawn_actors`` takes them. Returns ``extent``, ``addresses`` and
        ``dead``, or ``failures`` (rank -> packed exception) when ``__init__`` raised.
        Raises ``HubTimeout`` after ``timeout`` seconds."""

    @abc.abstractmethod
    def stop_actors(self, proc_mesh: str, name: str, timeout: float | None = None) -> list[dict]:
        """Stop actor mesh ``name`` of ``proc_mesh``; returns the ranks still running
        (``rank``, ``running``) after their interrupt."""

    @abc.abstractmethod
    def stop_procs(self, name: str) -> None:
        """Stop proc mesh ``name`` and its actors; blocks until the processes exited."""

    @abc.abstractmethod
    def restart_procs(self, proc_mesh: str, proc_ranks: list[int] | None, timeout: float) -> dict:
        """Restart ``proc_ranks`` of ``proc_mesh`` (``None``: the failed ones) and their
        actors; returns ``restarted`` and ``actor_meshes`` records."""

    @abc.abstractmethod
    def proc_mesh_record(self, name: str) -> dict | None:
        """The registry's record of proc mesh ``name`` (``procs``), ``None`` if stopped."""

    @abc.abstractmethod
    def actor_mesh_record(self, proc_mesh: str, name: str) -> dict | None:
        """The registry's record of actor mesh ``name`` of ``proc_mesh`` (``proc_ranks``),
        ``None`` if stopped."""

    @abc.abstractmethod
    def interrupt(self, procs: list[dict], timeout: float) -> None:
        """KeyboardInterrupt into every endpoint running in ``procs`` (their records)."""

    @abc.abstractmethod
    def interrupt_calls(self, meshes: list[tuple[str, str, dict[int, list[tuple[str, int]]]]],
                        timeout: float) -> list[int]:
        """Interrupt calls of the actor meshes ``meshes``, each ``(proc_mesh, name,
        routes)``: for each base rank, the calls whose replies go to ``routes[rank]``
        (``(address, port)``) get KeyboardInterrupt if running, and are refused if they
        have not begun; other calls and other actors of the procs carry on (an ``async``
        actor's running calls are all interrupted). Every mesh's procs are asked at once,
        and the procs of all of them get ``timeout`` seconds together to confirm (an RL
        loop's generator, reward and trainer meshes interrupted by one Ctrl-C wait once,
        not once each). Returns, per mesh of ``meshes``, how many procs did not confirm."""

    @abc.abstractmethod
    def paused(self, timeout: float) -> list[dict]:
        """The paused threads (debugger stops) of the cluster."""

    @abc.abstractmethod
    def set_rank_env(self, proc_mesh: str, env: dict[int, dict]) -> None:
        """Remember each proc's torch variables (base rank -> env), for restarts."""

    @abc.abstractmethod
    def machines(self, host_ids: set[str]) -> int:
        """How many distinct machines (hostnames) the hosts ``host_ids`` are on."""


def abandon_spawn(control: ControlPlane, proc_mesh: str, name: str) -> None:
    """Stop actor mesh ``name`` of ``proc_mesh`` whose spawn this client gave up on
    (constructors still running are interrupted)."""
    try:
        control.stop_actors(proc_mesh, name, timeout=30.0)
    except ClusterError:  # the cluster itself is gone: nothing left to stop
        pass


def init_error(mesh: str, what: str, packed: dict, extent: Extent, note: str = "") -> ActorError:
    """The :class:`ActorError` for actors whose ``__init__`` raised (``packed``: rank ->
    the exception as the proc packed it; ``note``: said after its first line)."""
    failures = []
    for rank, frames in sorted(packed.items()):
        exc, tb = unpack_exception(serialize.loads(frames))
        failures.append(RemoteFailure(extent.point(int(rank)), exc, tb))
    return ActorError(mesh, what, failures, extent.nelements, note)
