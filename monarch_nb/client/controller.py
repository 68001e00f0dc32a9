"""``get_or_spawn_controller``: one actor per name per cluster (Monarch's controllers).

A controller holds state and coordination that every client and actor of a cluster
share: a store, a coordinator, a debugger's registry. It lives in the cluster's
``controllers`` proc mesh (one proc on the cluster's first host), spawned on first use
and owned by the cluster, not by the client or actor that asked first: it lives as long
as the cluster does (a retained cluster's outlive every client) and nobody's
``__supervise__`` hears of its failures (clients' ``unhandled_fault_hook`` does).

Asking twice, from any client or from inside an endpoint, gives the same actor: the hub
spawns one mesh of a name at a time and returns a live mesh to a second spawn of it.
"""

from __future__ import annotations

from typing import Any, TypeVar

from ..proc.actor import Actor, unowned
from .cluster import default_cluster
from .future import Future
from .runtime import runtime

CONTROLLERS = "controllers"  # the proc mesh controllers live in

A = TypeVar("A", bound=Actor)


def get_or_spawn_controller(name: str, Class: type[A], *args: Any, **kwargs: Any) -> Future[A]:
    """The controller ``name``: the one actor of that name in this cluster, spawned as
    ``Class(*args, **kwargs)`` on first use; later calls (any client, any endpoint) get
    the same actor, their arguments unused. Returns a ``Future`` of its handle (an
    :class:`ActorMesh` of one actor, extent ``{}``, typed as ``Class`` as by
    ``ProcMesh.spawn``), as in Monarch, already finished:
    the spawn has run before this returns (unlike Monarch, where it runs when awaited).

    The first call blocks until the controller's ``__init__`` has returned, and starts
    the ``controllers`` proc (and, in a script with no cluster, an ephemeral cluster).
    Raises ``ValueError`` when ``name`` is taken by a controller of another class, and
    what ``ProcMesh.spawn`` raises. A controller whose ``__init__`` raised, or that died
    since, is still returned: calls to it raise :class:`SupervisionError`.
    """
    with unowned():  # the cluster's, wherever asked from
        first_host = default_cluster().host_mesh().slice(hosts=0)  # an int drops the dimension: extent {}
        procs = first_host.spawn_procs(per_host={}, name=CONTROLLERS)
        mesh = procs._spawn(name, Class, args, kwargs, same_construction=False)
    return Future.finished(runtime(), f"get_or_spawn_controller({name!r})", mesh)
