"""Which calls go through the host routers (``host.router``), and through which.

A call over a mesh whose actors live on several hosts may leave the client as one
message per host, to each host's router, instead of one per actor
(``MONARCH_NB_ROUTER``, see :func:`router_threshold`). The choice is made per mesh, not
per call or slice: every call of this client to an actor of a routed mesh then takes
the same path (client -> its host's router -> the actor), which is what keeps a
caller's calls to one actor in the order sent. The table of a mesh (actor address ->
router, base rank, proc) comes from the hub once, then is kept until the mesh's
addresses change (a restart).
"""

from __future__ import annotations

import os
import threading

from ..errors import ClusterError
from ..protocol import hub_ops, router_ops

# Where MONARCH_NB_ROUTER is unset: meshes of this many actors or more that span hosts
# go through routers; None: none do (see docs/scale.md for why it is off by default).
DEFAULT_THRESHOLD: int | None = None

Route = tuple[str, int, str]  # (router address, base rank, proc id)


def router_threshold() -> int | None:
    """The smallest mesh (actors) whose calls go through routers, from
    ``MONARCH_NB_ROUTER``: ``off`` (never), ``on`` (every mesh that spans hosts), or a
    number of actors; ``None`` for never. Raises ``ValueError`` for anything else."""
    value = os.environ.get(router_ops.ROUTER_ENV, "").strip().lower()
    if not value:
        return DEFAULT_THRESHOLD
    if value == router_ops.ROUTER_OFF:
        return None
    if value == router_ops.ROUTER_ON:
        return 1
    try:
        threshold = int(value)
    except ValueError:
        threshold = 0
    if threshold < 1:
        raise ValueError(f"{router_ops.ROUTER_ENV}={value!r}: give {router_ops.ROUTER_OFF!r}, "
                         f"{router_ops.ROUTER_ON!r} or the number of actors (>= 1) from which a mesh that "
                         "spans hosts is called through the host routers")
    return threshold


def may_route(actors: int, hosts: int) -> bool:
    """Whether calls to a mesh of ``actors`` actors on ``hosts`` hosts may go through the
    host routers (``MONARCH_NB_ROUTER`` lets a mesh that large through, and it spans
    hosts). Such a mesh's actors are not asked to connect straight back to the client:
    its replies come through the routers, and a connection per actor is what routing
    saves the client."""
    threshold = router_threshold()
    return threshold is not None and actors >= threshold and hosts >= 2


class HostRoutes:
    """This client's tables of routed meshes (one per runtime)."""

    def __init__(self, local_planes: dict):
        self._local_planes = local_planes  # the runtime's this_proc() planes: no hub, no routers
        self._lock = threading.Lock()
        # (cluster id, mesh key) -> (the addresses it was learnt for, address -> route;
        # None: called directly). One entry per mesh: a restart's new addresses replace it.
        self._tables: dict[tuple[str, str], tuple[tuple[str, ...], dict[str, Route] | None]] = {}

    def routes(self, mesh) -> dict[str, Route] | None:
        """The routes of ``mesh`` (an ``ActorMesh``: not imported, it imports this through
        the runtime), actor address -> (router, base rank, proc id), or ``None`` when
        its calls go straight to the actors. Asks the hub the first time; raises
        ``ValueError`` for a bad ``MONARCH_NB_ROUTER``."""
        threshold = router_threshold()
        if threshold is None or len(mesh._addresses) < threshold or mesh._cluster_id in self._local_planes:
            return None
        key, addresses = (mesh._cluster_id, mesh._key), tuple(mesh._addresses)
        with self._lock:
            known = self._tables.get(key)
        if known is not None and known[0] == addresses:
            return known[1]
        try:
            table = self._learn(mesh)
        except ClusterError:
            # The hub can't say (stopped, restarting): this call goes straight to the
            # actors, which fail it as they would (a stopped cluster, a dead actor); the
            # table is asked for again at the next call.
            return None
        with self._lock:
            self._tables[key] = (addresses, table)
        return table

    @staticmethod
    def _learn(mesh) -> dict[str, Route] | None:
        info = mesh._hub().request(hub_ops.INFO, timeout=30.0)
        record = info["actor_meshes"].get(mesh._key)
        procs_record = record and info["proc_meshes"].get(record["proc_mesh"])
        if not procs_record:
            return None
        routers = {h["host_id"]: h.get(router_ops.ROUTER_ADDRESS, "") for h in info["hosts"]}
        procs = procs_record["procs"]
        table: dict[str, Route] = {}
        for base, (address, proc_rank) in enumerate(zip(mesh._addresses, record["proc_ranks"])):
            proc = procs[proc_rank]
            router = routers.get(proc["host_id"], "")
            if not router:  # an agent without a router (an older one): the whole mesh goes direct
                return None
            table[address] = (router, base, proc["proc_id"])
        if len({route[0] for route in table.values()}) < 2:
            return None  # one host: a router would only add a hop
        return table
