"""Which calls go through the host routers (``host.router``), and through which.

A call over a mesh whose actors live on several hosts may leave the client as one
message per host, to each host's router, instead of one per actor
(``MONARCH_NB_ROUTER``, see :func:`router_policy`). The choice is made per mesh, not
per call or slice: every call of this client to an actor of a routed mesh then takes
the same path (client -> its host's router -> the actor), which is what keeps a
caller's calls to one actor in the order sent. The table of a mesh (actor address ->
router, base rank, proc) comes from the hub once, then is kept until the mesh's
addresses change (a restart).

With ``MONARCH_NB_ROUTER_RELAY=on`` (see :func:`relay_policy`), a client sends each
routed call as one message, to one router of the cluster, its relay, which passes it on
to the other hosts' routers and sends their replies back with its own: the client then
sends and receives about one message per call, not one per host. Every routed call of
the client to that cluster goes through the same relay, so each actor's calls still
take one path; another is taken only once the relay's host is lost (the calls relayed
through it fail). The price: the relay's host is on the path of every routed call, so
its stall or loss fails calls to every host (docs/scale.md), hence off by default.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from typing import Callable

from ..errors import ClusterError
from ..protocol import hub_ops, router_ops

# Where MONARCH_NB_ROUTER is unset: meshes of this many actors or more whose hosts are
# on two machines or more go through routers (docs/scale.md: where the client's CPU per
# call through routers falls below the direct path's, measured by bench/bench_scale.py).
DEFAULT_THRESHOLD = 64

Route = tuple[str, int, str]  # (router address, base rank, proc id)


@dataclass(frozen=True)
class RouterPolicy:
    """Which meshes are called through the host routers (``MONARCH_NB_ROUTER``)."""

    threshold: int | None  # the smallest mesh (actors) routed; None: none is
    # Only meshes whose hosts are on two machines or more (the default): routers pay off
    # where their work runs on other machines' cores; local host agents share the
    # client's, and a router there only adds a hop.
    across_machines: bool

    def allows(self, actors: int, hosts: int) -> bool:
        """Whether a mesh of ``actors`` actors on ``hosts`` hosts may be routed (its
        machines still to be counted where ``across_machines``)."""
        return self.threshold is not None and actors >= self.threshold and hosts >= 2


def router_policy() -> RouterPolicy:
    """The policy ``MONARCH_NB_ROUTER`` sets: unset, meshes of ``DEFAULT_THRESHOLD``
    actors or more on two machines or more; ``off``: none; ``on``: every mesh that spans
    hosts (on one machine too: local host agents); a number N: those of N actors or more.
    Raises ``ValueError`` for anything else."""
    return _policy_of(os.environ.get(router_ops.ROUTER_ENV, ""))


@functools.lru_cache(maxsize=8)
def _policy_of(setting: str) -> RouterPolicy:
    # Cached (a refusal is not): every call asks, and parsing was ~5% of a call_one's
    # work in the client.
    value = setting.strip().lower()
    if not value:
        return RouterPolicy(DEFAULT_THRESHOLD, across_machines=True)
    if value == router_ops.ROUTER_OFF:
        return RouterPolicy(None, across_machines=False)
    if value == router_ops.ROUTER_ON:
        return RouterPolicy(1, across_machines=False)
    try:
        threshold = int(value)
    except ValueError:
        threshold = 0
    if threshold < 1:
        raise ValueError(f"{router_ops.ROUTER_ENV}={value!r}: give {router_ops.ROUTER_OFF!r}, "
                         f"{router_ops.ROUTER_ON!r} or the number of actors (>= 1) from which a mesh that "
                         "spans hosts is called through the host routers")
    return RouterPolicy(threshold, across_machines=False)


def relay_policy() -> bool:
    """Whether routed calls go through one relay router (``MONARCH_NB_ROUTER_RELAY=on``)
    or to each host's router from the client (unset or ``off``). Raises ``ValueError``
    for anything else."""
    return _relay_of(os.environ.get(router_ops.RELAY_ENV, ""))


@functools.lru_cache(maxsize=4)
def _relay_of(setting: str) -> bool:
    value = setting.strip().lower()
    if value == router_ops.ROUTER_ON:
        return True
    if value in ("", router_ops.ROUTER_OFF):
        return False
    raise ValueError(f"{router_ops.RELAY_ENV}={value!r}: give {router_ops.ROUTER_ON!r} (one router relays each "
                     f"routed call to the others) or {router_ops.ROUTER_OFF!r} (the client sends to every host's "
                     "router itself)")


def may_route(actors: int, hosts: int, machines: Callable[[], int]) -> bool:
    """Whether calls to a mesh of ``actors`` actors on ``hosts`` hosts may go through the
    host routers (``router_policy``; ``machines()``, asked only when the policy needs
    it, counts the distinct machines of those hosts). Such a mesh's actors are not asked
    to connect straight back to the client: its replies come through the routers, and a
    connection per actor is what routing saves the client."""
    policy = router_policy()
    return policy.allows(actors, hosts) and (not policy.across_machines or machines() >= 2)


class HostRoutes:
    """This client's tables of routed meshes (one per runtime)."""

    def __init__(self, local_planes: dict):
        self._local_planes = local_planes  # the runtime's this_proc() planes: no hub, no routers
        self._lock = threading.Lock()
        # (cluster id, mesh key) -> (the addresses it was learnt for, address -> route
        # (None: to be called directly whatever the policy), the machines of its hosts).
        # One entry per mesh: a restart's new addresses replace it.
        self._tables: dict[tuple[str, str], tuple[tuple[str, ...], dict[str, Route] | None, int]] = {}
        self._relays: dict[tuple[str, str], str] = {}  # (cluster id, mesh key) -> the router its calls go through
        # id(table) -> (that table, its every actor grouped by router: by_router's answer
        # for a call over the whole mesh, the usual one, made once per table)
        self._whole: dict[int, tuple[dict[str, Route], dict[str, list]]] = {}

    def relay(self, cluster_id: str, mesh_key: str, routers, lost: Callable[[str, str], str | None]) -> str | None:
        """The router this client's routed calls to the mesh ``mesh_key`` of ``cluster_id``
        go through (``relay_policy``), ``None`` when each goes to its host's router: the
        first of ``routers`` (the first call's, in rank order: one of the mesh's own
        hosts), so that losing it fails only calls to meshes that lose a rank there too.
        It stays the same for every call to the mesh, slices included (per (caller,
        actor) order), until ``lost(cluster_id, router)`` says its host was lost; then
        the first of this call's ``routers`` not lost takes its place."""
        if not relay_policy():
            return None
        key = (cluster_id, mesh_key)
        with self._lock:
            relay = self._relays.get(key)
        if relay is not None and lost(cluster_id, relay) is None:
            return relay
        relay = next((r for r in routers if lost(cluster_id, r) is None), None)
        if relay is not None:
            with self._lock:
                self._relays[key] = relay
        return relay

    def by_router(self, table: dict[str, Route], addresses: list[str]) -> dict[str, list]:
        """The actors at ``addresses`` (of the mesh whose routes are ``table``) grouped by
        their router: router address -> ``[[address, base rank, proc id], ...]``
        (``router_ops.TARGETS``), in the order of ``addresses`` within a router. A call
        over every actor of the mesh gets a new dict of lists made once per table (the
        order within a router is then the mesh's): neither is to be changed in place."""
        if len(addresses) != len(table):
            return _grouped(table, addresses)
        with self._lock:
            known = self._whole.get(id(table))
        if known is None or known[0] is not table:
            known = (table, _grouped(table, list(table)))
            with self._lock:
                if len(self._whole) >= len(self._tables) + 8:  # (tables of meshes re-learnt or gone)
                    self._whole.clear()
                self._whole[id(table)] = known
        return dict(known[1])

    def routes(self, mesh) -> dict[str, Route] | None:
        """The routes of ``mesh`` (an ``ActorMesh``: not imported, it imports this through
        the runtime), actor address -> (router, base rank, proc id), or ``None`` when
        its calls go straight to the actors. Asks the hub the first time; raises
        ``ValueError`` for a bad ``MONARCH_NB_ROUTER``."""
        policy = router_policy()
        if not policy.allows(len(mesh._addresses), 2) or mesh._cluster_id in self._local_planes:
            return None
        key, addresses = (mesh._cluster_id, mesh._key), tuple(mesh._addresses)
        with self._lock:
            known = self._tables.get(key)
        if known is None or known[0] != addresses:
            try:
                table, machines = self._learn(mesh)
            except ClusterError:
                # The hub can't say (stopped, restarting): this call goes straight to the
                # actors, which fail it as they would (a stopped cluster, a dead actor);
                # the table is asked for again at the next call.
                return None
            known = (addresses, table, machines)
            routers = {route[0] for route in (table or {}).values()}  # (no loop inside the lock: wire.interrupts)
            with self._lock:
                self._tables[key] = known
                if self._relays.get(key) not in routers:
                    # A mesh spawned again under its name, on other hosts: no actor of it
                    # had a call through that relay, so a new one keeps every order.
                    self._relays.pop(key, None)
        _, table, machines = known
        if policy.across_machines and machines < 2:
            return None  # local host agents: their routers would share the client's cores
        return table

    @staticmethod
    def _learn(mesh) -> tuple[dict[str, Route] | None, int]:
        """``mesh``'s routes from the hub (``None``: it is on one host, or a host has no
        router), and how many machines its hosts are on."""
        info = mesh._hub().request(hub_ops.INFO, timeout=30.0, **{hub_ops.INFO_OF: {"actor_meshes": [mesh._key]}})
        record = info["actor_meshes"].get(mesh._key)
        procs_record = record and info["proc_meshes"].get(record["proc_mesh"])
        if not procs_record:
            return None, 0
        routers = {h["host_id"]: h.get(router_ops.ROUTER_ADDRESS, "") for h in info["hosts"]}
        machine_of = {h["host_id"]: h.get("hostname", "") for h in info["hosts"]}
        procs = procs_record["procs"]
        machines = len({machine_of.get(procs[r]["host_id"]) for r in record["proc_ranks"]})
        table: dict[str, Route] = {}
        for base, (address, proc_rank) in enumerate(zip(mesh._addresses, record["proc_ranks"])):
            proc = procs[proc_rank]
            router = routers.get(proc["host_id"], "")
            if not router:  # an agent without a router (an older one): the whole mesh goes direct
                return None, machines
            table[address] = (router, base, proc["proc_id"])
        if len({route[0] for route in table.values()}) < 2:
            return None, machines  # one host: a router would only add a hop
        return table, machines


def _grouped(table: dict[str, Route], addresses: list[str]) -> dict[str, list]:
    """:meth:`HostRoutes.by_router`, made afresh."""
    by_router: dict[str, list] = {}
    for address in addresses:
        router, base, proc_id = table[address]
        by_router.setdefault(router, []).append((address, base, proc_id))
    return by_router
