"""Replica groups on hosts of their own (``ReplicaGroups(hosts_per_group=k)``): each
group, and the warm spare, runs on ``k`` hosts no other group uses, so that a lost machine
(``inject_fault(..., "host")``, a dead host agent) costs one group only. A group is
started again on its own hosts while they are live, and on free live hosts once one of
them is lost; hosts beyond ``num_groups * k`` are what it moves to.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from ..client.allocations import every_host
from ..client.host_mesh import HostMesh
from ..client.proc_mesh import ProcMesh
from ..errors import ClusterError
from ..mesh import Extent
from ..protocol import hub_ops


SPARE = "spare"  # the warm spare's key, beside the groups' indices
Key = int | str


def hosts_of(procs: ProcMesh) -> list[str]:
    """The host ids ``procs`` run on, in rank order, each once."""
    return list(dict.fromkeys(p["host_id"] for p in procs._procs))


class HostPlacement:
    """Which ``per_group`` hosts of ``hosts`` (a mesh over ``{"hosts": N}``) a group
    starts on. Raises ``ValueError`` when ``hosts`` has fewer than ``min_hosts``."""

    def __init__(self, hosts: HostMesh, per_group: int, min_hosts: int):
        if per_group < 1:
            raise ValueError(f"ReplicaGroups: hosts_per_group={per_group}; give 1 or more")
        if len(hosts._hosts) < min_hosts:
            raise ValueError(f"ReplicaGroups: hosts_per_group={per_group} needs {min_hosts} hosts, one set per "
                             f"group; the host mesh has {len(hosts._hosts)}")
        self._hosts, self._per_group = hosts, per_group

    def lost(self) -> set[str]:
        return lost_hosts(self._hosts)

    def tear_down(self, procs: ProcMesh) -> None:
        tear_down(procs, self.lost())

    def hosts_for(self, key: Key, now: list[str], taken: Iterable[str]) -> HostMesh:
        """Where group ``key`` (its index, or ``SPARE``) starts: ``now`` (the hosts it
        ran on) while none of them is lost, else the first live hosts not in ``taken``
        (the other groups' and the spare's). Blocking (one request to the hub). Raises
        :class:`ClusterError` when too few are free."""
        lost = self.lost()
        if len(now) == self._per_group and not lost & set(now):
            return self._mesh(now)
        busy = set(taken)
        free = [h for h in self._hosts._hosts if h not in lost and h not in busy]
        if len(free) < self._per_group:
            raise ClusterError(f"no {self._per_group} free live host(s) to start a replica group on: "
                               f"lost {sorted(lost)}, used by the others {sorted(busy)}; give the host mesh "
                               "spare hosts")
        return self._mesh(free[:self._per_group])

    def took_spare(self, key: Key) -> None:
        """Group ``key`` runs on the spare's hosts from now on (nothing to do: hosts are
        the host mesh's, not the group's)."""

    def release(self, key: Key) -> None:
        """Group ``key`` is gone for good (nothing to give back here)."""

    def stop(self) -> None:
        """Every group has stopped (nothing to give back here)."""

    def _mesh(self, host_ids: list[str]) -> HostMesh:
        if self._per_group == 1:  # one host, no dimensions: the group's procs are over per_group only
            return self._hosts.slice(hosts=self._hosts._hosts.index(host_ids[0]))
        return HostMesh(self._hosts._cluster_id, self._hosts._hub_address, host_ids, self._hosts._python,
                        Extent({"hosts": len(host_ids)}), owned=False)


def _stop_quietly(procs: ProcMesh) -> None:
    try:
        procs.stop()
    except Exception:  # noqa: BLE001 - its processes are gone; the cluster may be stopping too
        pass


def lost_hosts(hosts: HostMesh) -> set[str]:
    """The ids of the hosts of ``hosts``'s cluster, added allocations' included, whose
    agent the hub counts as lost, and those of ``hosts`` it no longer knows (a recovered
    hub drops the hosts that did not answer it; asks the hub)."""
    listed = every_host(hosts._hub().request(hub_ops.INFO, timeout=30.0))
    known = {h["host_id"] for h in listed}
    return {h["host_id"] for h in listed if h["lost"]} | {h for h in hosts._hosts if h not in known}


def tear_down(procs: ProcMesh, lost: set[str]) -> None:
    """Stop ``procs``, blocking; those on a host in ``lost`` in the background instead:
    they died with their host agent, and the hub's stop waits for that agent's answer
    (10 s) while nothing there needs stopping."""
    if not lost & set(hosts_of(procs)):
        procs.stop()
        return
    threading.Thread(target=_stop_quietly, args=(procs,), daemon=True,
                     name=f"monarch-nb-stop-{procs._name}").start()
