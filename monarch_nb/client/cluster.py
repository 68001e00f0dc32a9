"""A cluster as seen from a client: starting or connecting to it, its meshes, stopping it.

Two kinds of cluster:

- *ephemeral*: a script's first ``this_host()`` starts one. Its hub is a child of
  this process and dies with it (``PR_SET_PDEATHSIG`` plus a parent watchdog), taking
  every host agent and proc along; it is stopped at interpreter exit.
- *retained*: ``Cluster.start(name)`` starts a detached hub that keeps its procs and
  actors when every client is gone. Any later client (the same notebook after a kernel
  restart, another notebook, a script) attaches with ``connect(name)`` and gets live
  handles to the same actors, their state intact. ``stop()`` ends it.
"""

from __future__ import annotations

import atexit
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import psutil

from .. import cluster_dir, fd_limit
from ..errors import ClusterError, ClusterNotFound, HubTimeout, InvalidRequest
from ..mesh import Extent, Shape
from ..proc.actor import proc_identity
from ..protocol import envelope, hub_ops, proc_ops
from ..protocol.states import DiscoveryState
from ..wire import frames as wire_frames
from ..protocol.records import LOG_FIELDS
from . import binding, discovery
from .actor_mesh import ActorMesh
from .actor_meshes import ActorMeshes
from .future import Future
from .host_mesh import HostMesh
from .host_routes import may_route
from .hub_client import HubClient, watch_hub
from .launch import HUB_START_TIMEOUT_S, launch_hub
from .presence import Presence, join_hub
from .proc_mesh import ProcMesh
from .runtime import runtime

if TYPE_CHECKING:
    from .debugger import Debugger

STOP_TIMEOUT_S = 15.0
DEFAULT_NAME = "default"
DEFAULT_GRACE_S = 10.0  # retained: how long procs outlive a dead hub, waiting for recovery
# How long a client leaving at exit waits for lines its calls caused (a dead or stuck
# hub must not hold a script's exit for longer).
EXIT_FLUSH_TIMEOUT_S = 5.0
HUB_LOST_MARGIN_S = 1.0  # after the grace: the agents' own heartbeat that notices
LOCAL_AGENT_BYTES = 45 << 20  # one idle local host agent's resident memory (bench_scale: 43 MiB)


class Cluster:
    """A running cluster: its meshes (``proc_meshes``, ``actor_meshes``,
    ``host_mesh()``), ``info()`` and ``stop()``.

    Get one with :meth:`start`, :func:`connect` or (ephemeral) ``this_host()``."""

    def __init__(self, name: str, path: Path, info: dict, hub_process: subprocess.Popen | None = None):
        self.name = name
        self.path = path
        self._info = info
        self._hub_process = hub_process  # set for an ephemeral cluster: the hub is our child
        fd_limit.raise_soft_limit()  # a client holds a few descriptors per proc it calls
        wire_frames.register_key(info["cluster_id"], cluster_dir.key_of(info))
        binding.receive_from(info["hub"])  # a multi-host cluster's procs must reach our inboxes
        self.hub = HubClient(info["cluster_id"], info["hub"])
        watch_hub(info["hub"], self._check_hub)
        self._presence: Presence | None = None
        self._stopped = False
        self._hub_lost_since: float | None = None  # monotonic; while the hub is known dead
        self._hub_lost_told = False
        self._debugger: "Debugger | None" = None  # made on first use
        self._debugger_lock = threading.Lock()
        # Called when a new hub answers at this cluster's address (on_new_hub):
        # what the old hub kept for this client (subscriptions) is gone.
        self._on_new_hub: list[Callable[[], None]] = []

    def _check_hub(self) -> None:
        """Raise :class:`ClusterError` when this cluster's hub is known dead (checked on
        this machine), so that requests to it fail in about a second, not at timeout."""
        problem = discovery.hub_process_problem(self._info)
        if not problem:
            return
        if self._stopped or not self.path.exists():  # stopped on purpose, here or by another client
            # (before the request, or while it waited: the same to the caller)
            by = "by this client" if self._stopped else "by another client or `monarch-nb cluster stop`"
            raise ClusterError(f"cluster {self.name!r} was stopped ({by}): start or connect to a cluster")
        try:  # recovered meanwhile, at the same address?
            current = cluster_dir.read_info(self.path)
            recovered = current.get("hub") == self._info["hub"] and not discovery.hub_process_problem(current)
        except (OSError, ValueError):
            recovered = False
        if recovered:
            self._info = current
            for told in list(self._on_new_hub):
                told()
            return
        raise ClusterError(f"the hub of cluster {self.name!r} is gone: {problem}; recover it with "
                           f"monarch_nb.Cluster.recover({self.name!r}) or `monarch-nb cluster recover {self.name}`")

    def on_new_hub(self, told: Callable[[], None]) -> Callable[[], None]:
        """Call ``told()`` each time this client finds a new hub serving this cluster at
        its address (``Cluster.recover`` ran here or elsewhere; found within about a
        second by the presence thread's check, or sooner by a request: ``told`` runs on
        that thread and must not block). Only a hub on this
        machine can be told apart from its predecessor. Returns the function that stops it."""
        self._on_new_hub.append(told)
        return lambda: self._on_new_hub.remove(told) if told in self._on_new_hub else None

    def _watch_hub(self) -> None:
        """Once a second (the heartbeat's thread): when the hub has been dead for longer
        than the grace period after which its host agents stop every proc, no hub is left
        to report those deaths, so the calls waiting on this cluster's actors fail with
        :class:`SupervisionError`, and later ones at once (they waited until their
        timeout, or for ever); once a hub is back (recovered), calls work again."""
        problem = discovery.hub_process_problem(self._info)
        if problem:
            try:
                self._check_hub()  # recovered at the same address meanwhile?
                problem = ""
            except ClusterError:
                pass
        if not problem or self._stopped:
            if self._hub_lost_told:
                runtime().supervision.hub_back(self._info["cluster_id"])
            self._hub_lost_since, self._hub_lost_told = None, False
            return
        now = time.monotonic()
        self._hub_lost_since = self._hub_lost_since or now
        grace = float(self._info.get("grace_s", DEFAULT_GRACE_S))
        if self._hub_lost_told or now - self._hub_lost_since < grace + HUB_LOST_MARGIN_S:
            return
        self._hub_lost_told = True
        again = ("shutdown_context() ends it, and the next this_host() starts a new cluster"
                 if self._hub_process is not None else
                 f"`monarch-nb cluster recover {self.name}` starts a new hub; then spawn the meshes again")
        runtime().supervision.hub_lost(
            self._info["cluster_id"],
            f"the hub of cluster {self.name!r} died ({problem}), and its host agents stop every proc "
            f"{grace:g} s after that: this cluster's actors are gone; {again}")

    # starting and connecting -------------------------------------------------------
    @classmethod
    def start(cls, name: str = DEFAULT_NAME, hosts: int | None = None, grace_s: float = DEFAULT_GRACE_S,
              idle_timeout: float | None = None, allocator=None) -> "Cluster":
        """Start the retained cluster ``name`` with ``hosts`` local host agents (default
        1) and connect to it; returns once its hub and host agents are up (~0.3 s).

        ``allocator``: where hosts come from instead, e.g.
        ``SlurmAllocator(nodes=2, partition="debug")`` (one host per node, from a batch
        job; returns once the job runs and every agent has reported, or raises
        :class:`ClusterError` with the job's state and reason after its
        ``start_timeout``).

        The hub runs detached: it keeps every proc and actor when this client exits,
        until :meth:`stop`, or until no client has been connected for ``idle_timeout``
        seconds (``None``: never). If the hub dies, host agents keep their procs for
        ``grace_s`` seconds, waiting for :meth:`recover`.

        Starting a name that is already running connects to it (so re-running the cell
        works) unless a different ``hosts`` was asked for, which raises
        :class:`InvalidRequest`; several clients starting one name at once share one
        cluster. A stale directory of that name (hub dead) is recovered when its host
        agents are still alive, else cleared first. Raises ``ValueError`` for a bad
        name or argument and :class:`ClusterError` when the hub does not come up."""
        _check_start_args(name, hosts, grace_s, idle_timeout)
        spec = _allocator_spec(allocator, hosts)
        if allocator is None and hosts is not None:
            _check_local_hosts(hosts)
        hosts = allocator.hosts if allocator is not None else hosts
        with cluster_dir.locked(name):
            found = discovery.probe(name)
            if found.state == DiscoveryState.RUNNING:
                running_hosts = len(found.hub_info["hosts"])
                running_kind = (found.info.get("allocator") or {}).get("kind", "local")
                if (hosts is not None and running_hosts != hosts
                        or allocator is not None and running_kind != spec["kind"]):
                    raise InvalidRequest(
                        f"cluster {name!r} is already running with {running_hosts} host(s) ({running_kind}), not "
                        f"{hosts} ({spec['kind']}); use monarch_nb.connect({name!r}), or stop it first "
                        f"(monarch_nb.connect({name!r}).stop())")
                return cls(name, found.path, found.info)._attach()
            if found.state in (DiscoveryState.STALE, DiscoveryState.STARTING):
                if found.info.get("hub_pid") and not discovery.hub_process_problem(found.info):
                    doing = ("is still starting (a hub whose starting client went away stops within seconds)"
                             if found.state == DiscoveryState.STARTING else "is running but does not answer")
                    raise ClusterError(f"cluster {name!r}: its hub (pid {found.info['hub_pid']}) {doing}; try "
                                       f"again, or end it with `monarch-nb cluster stop {name}`")
                if discovery.leftover_agents(found.path) and (found.path / "state.json").exists():
                    return cls._recover(found)
                discovery.remove_stale(found.path)
            _check_config()
            path, info = cluster_dir.create(name)
            try:
                launch_hub(path, hosts=hosts or 1, grace_s=grace_s, idle_timeout=idle_timeout,
                           allocator=spec if allocator is not None else None,
                           timeout=HUB_START_TIMEOUT_S + getattr(allocator, "start_timeout_s", 0))
            except BaseException:  # also KeyboardInterrupt: the hub stops when the pipe breaks
                shutil.rmtree(path, ignore_errors=True)
                raise
            return cls(name, path, cluster_dir.read_info(path))._attach()

    @classmethod
    def recover(cls, name: str = DEFAULT_NAME, force: bool = False) -> "Cluster":
        """Start a new hub for the retained cluster ``name`` whose hub died, re-adopting
        its host agents, procs and meshes from the state file (actor state is intact:
        the procs never stopped). Must happen within the cluster's grace period
        (``grace_s`` of :meth:`start`) after the hub's death. Blocks until the new hub
        is up (~1 s, plus up to 2 s asking the old one).

        A hub whose process is alive but does not answer (stopped, or too busy) is
        left alone unless ``force=True``, which SIGKILLs it first.

        Raises :class:`ClusterNotFound` when there is nothing to recover, and
        :class:`InvalidRequest` when the cluster is running, or its hub is alive and
        ``force`` is not given."""
        with cluster_dir.locked(name):
            found = discovery.probe(name)
            if found.state == DiscoveryState.RUNNING:
                raise InvalidRequest(f"cluster {name!r} is running; nothing to recover. "
                                     f"Use monarch_nb.connect({name!r})")
            if found.state == DiscoveryState.MISSING or not (found.path / "state.json").exists():
                raise ClusterNotFound(f"cluster {name!r} has no state to recover" + _running_hint())
            if not force and discovery.hub_alive(found.info):
                # A hub paused for a moment would answer again: killing it is the user's call.
                raise InvalidRequest(
                    f"cluster {name!r}: its hub (pid {found.info['hub_pid']}) is alive but does not answer "
                    f"(stopped, or too busy); recover() does not kill a live hub. Try "
                    f"monarch_nb.connect({name!r}) again in a moment, or kill it and start a new hub with "
                    f"monarch_nb.Cluster.recover({name!r}, force=True) (`monarch-nb cluster recover --force {name}`)")
            discovery.end_hub(found.info)
            return cls._recover(found)

    @classmethod
    def _recover(cls, found: discovery.Probe) -> "Cluster":
        old = found.info
        launch_hub(found.path, hosts=old.get("hosts", 1), grace_s=old.get("grace_s", DEFAULT_GRACE_S),
                   idle_timeout=old.get("idle_timeout"), recover=True)
        return cls(found.name, found.path, cluster_dir.read_info(found.path))._attach()

    @classmethod
    def start_ephemeral(cls, hosts: int = 1, grace_s: float = 2.0, allocator=None) -> "Cluster":
        """Start a cluster that lives and dies with this process; returns once its hub and
        ``hosts`` host agents are up. ``allocator``: where hosts come from instead (as for
        :meth:`start`; it decides how many). Raises :class:`ClusterError` if they don't
        come up."""
        spec = _allocator_spec(allocator, None) if allocator is not None else None
        if allocator is None:
            _check_local_hosts(hosts)
        _check_config()
        name = f"{discovery.EPHEMERAL_PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        path, _ = cluster_dir.create(name)
        try:
            hub = launch_hub(path, hosts=allocator.hosts if allocator is not None else hosts, grace_s=grace_s,
                             ephemeral_parent=os.getpid(), allocator=spec,
                             timeout=HUB_START_TIMEOUT_S + getattr(allocator, "start_timeout_s", 0))
        except ClusterError:
            shutil.rmtree(path, ignore_errors=True)
            raise
        cluster = cls(name, path, cluster_dir.read_info(path), hub)
        cluster._join()
        atexit.register(cluster.stop)
        return cluster

    def _join(self) -> None:
        """Count this process as a client of the hub, which sends it the output of its
        calls (a notebook cell's end waits for it: ``ClientRuntime.attached``)."""
        self._presence = Presence(self._info["cluster_id"], self._info["hub"], self._watch_hub)
        runtime().attached[self._info["cluster_id"]] = self

    def _attach(self) -> "Cluster":
        """:meth:`_join`, and make ``this_host()`` mean this cluster."""
        self._join()
        atexit.register(self._leave_at_exit)
        rt = runtime()
        rt.supervision.hub_back(self._info["cluster_id"])  # a hub found dead before runs again
        with rt.cluster_lock:
            rt.cluster = self
        return self

    # what is in it -------------------------------------------------------------------
    def info(self) -> dict:
        """Hosts, clients, proc meshes and actor meshes as the hub knows them.

        ``hosts``: each with ``dropped_frames`` (frame sets its host agent dropped: bad
        signature, replay, or a message it could not act on), ``lost`` and ``cause``;
        ``hub_stats``: the hub's own ``dropped_frames``, ``refused_connections`` (peers
        refused at the handshake: no or a wrong cluster password), ``malformed`` (messages it
        could not act on), ``stalls`` (times it found itself stopped or blocked),
        ``sockets`` (open sending sockets) and ``log_store`` (``ok`` False while the
        disk fails; ``error``, ``unwritten``, ``lost``; ``file``, ``lines``, ``bytes``,
        ``expired`` and the limits ``max_bytes``, ``max_age_s``)."""
        return self.hub.request(hub_ops.INFO, timeout=30.0)

    def health(self) -> dict:
        """The cluster's health tree as data (blocks for one hub round trip: ~3 ms, and at
        most ~1 s more when a proc does not answer; ``ClusterError`` after 30 s).

        ``hosts`` -> ``procs`` (``state`` healthy / busy / paused / unresponsive / failed
        / lost, ``cause``, ``pid``, ``rss_bytes``, ``cpu_s``, ``uptime_s``) -> ``actors``
        (mesh, rank, class, state; ``endpoint`` and ``busy_s`` when busy); the same
        actors per actor mesh in ``actor_meshes`` (alive/size); meshes being spawned in
        ``starting``; ``summary`` ("8/8 procs healthy · 1 busy · 0 failed": healthy there
        means running, busy or paused included) and ``counts`` (procs per state, and
        ``alive``); ``services``: each service's replicas (``state`` of their procs, and,
        for a service this client routes, ``service_state``, ``requests``, ``in_flight``,
        ``latency_p50_s``/``latency_p99_s`` and ``restarts``). See ``monarch_nb.hub.health``."""
        tree = self.hub.request(hub_ops.HEALTH, timeout=30.0)
        return runtime().services.annotate(self._info["cluster_id"], tree)

    @property
    def services(self) -> dict:
        """Working handles on the cluster's services by name (``monarch_nb.service.Service``),
        also after a kernel restart: ``route``/``fanout`` reach the same replicas, and a
        failed replica is restarted in place (its actor made again from the constructor
        arguments the hub kept). A service this client made or got before is that same
        handle. Raises ``RuntimeError`` if ``monarch_nb.service`` was never imported."""
        adopt = runtime().services.adopt
        if adopt is None:
            raise RuntimeError("cluster.services needs monarch_nb.service: import monarch_nb.service (or "
                               "monarch_nb.actor) first")
        return adopt(self)

    @property
    def debugger(self) -> "Debugger":
        """Paused ranks, breakpoints, post-mortem and IDE relays of this cluster (see
        ``monarch_nb.client.debugger``)."""
        with self._debugger_lock:
            if self._debugger is None:
                from .debugger import Debugger

                self._debugger = Debugger(self)
            return self._debugger

    def host_mesh(self) -> HostMesh:
        """The cluster's hosts, extent ``{"hosts": N}`` (also for N = 1, as the host
        mesh of a Monarch job; see :meth:`this_host` for one host without dimensions)."""
        info = self.info()
        return HostMesh(self._info["cluster_id"], self._info["hub"], [h["host_id"] for h in info["hosts"]])

    def allocate(self, name: str, hosts: int | None = None, allocator=None) -> HostMesh:
        """More hosts for this running cluster, from an allocation of their own named
        ``name``: ``hosts`` local host agents (default 1), or what ``allocator`` gives,
        e.g. ``SlurmAllocator(nodes=2)`` (a Slurm job of its own, named
        ``monarch_nb-CLUSTER-NAME``). Returns an owned :class:`HostMesh` over
        ``{"hosts": N}`` once every new host agent has reported (a Slurm job's queue
        wait included, up to its ``start_timeout``); its ``shutdown()`` gives the
        allocation back: the procs on it stop, its agents exit and its job ends, while
        the rest of the cluster runs on. Its hosts show in ``health()``; a job that ends
        from outside fails them as the cluster's own. The allocation outlives this
        client, as the cluster does (``allocations`` finds it again).

        Allocating a name that exists with as many hosts, from the same kind of
        allocator, returns it (a re-run cell); a Ctrl-C while it waits gives it back.
        Raises ``ValueError`` for a bad name, a name taken with another size, or a bad
        ``hosts``; ``TypeError`` for something that is not an allocator;
        :class:`ClusterError` with the allocator's account (the job's state and reason)
        when the hosts don't come up."""
        from .allocations import allocate

        return allocate(self.hub, name, hosts, allocator)

    @property
    def allocations(self) -> dict[str, HostMesh]:
        """The allocations added with :meth:`allocate`, by name: owned handles on their
        hosts (``shutdown()`` gives one back); one still starting is not listed yet."""
        from .allocations import allocated_mesh

        return {name: allocated_mesh(self.hub, name, [h["host_id"] for h in added["hosts"]])
                for name, added in self.info().get("allocations", {}).items()
                if added["hosts"]}  # one still starting (its hosts not up yet) is not a mesh yet

    def this_host(self) -> HostMesh:
        """What ``this_host()`` is while this cluster is the current one: its one host
        with no dimensions (extent ``{}``, as Monarch's ``this_host()``), so
        ``spawn_procs(per_host=...)`` gives a proc mesh over exactly ``per_host``; with
        N > 1 hosts, all of them over ``{"hosts": N}``."""
        hosts = self.host_mesh()
        return hosts._owned_slice(hosts=0) if len(hosts) == 1 else hosts

    @property
    def proc_meshes(self) -> dict[str, ProcMesh]:
        """Live handles on every proc mesh of the cluster, by name (a fresh snapshot); a
        name it lacks raises ``KeyError`` naming those it has."""
        return _ProcMeshes({name: self._proc_mesh(record) for name, record in self.info()["proc_meshes"].items()})

    @property
    def actor_meshes(self) -> ActorMeshes[ActorMesh]:
        """Live handles on every actor mesh of the cluster (a fresh snapshot); calling
        them reaches the same actor objects as the client that spawned them. Keyed
        ``"PROC_MESH/NAME"`` (names are unique per proc mesh); ``[NAME]`` finds a mesh
        by its bare name too while only one proc mesh has one so named, else raises
        ``KeyError`` naming the keys."""
        info = self.info()
        records = info["actor_meshes"]
        return ActorMeshes({key: self._actor_mesh(record) for key, record in records.items()},
                           picked=lambda key: self._connect_ahead(records[key], info))

    def _proc_mesh(self, record: dict) -> ProcMesh:
        return ProcMesh(self._info["cluster_id"], self._info["hub"], record["name"],
                        Shape(Extent(record["extent"])), record["procs"])

    def _connect_ahead(self, record: dict, info: dict) -> None:
        """Open this thread's connections to the live actors of the mesh ``record`` (one a
        user picked from ``actor_meshes``), and ask each to connect back to this client's
        inbox (``proc_ops.CONNECT``), as a spawned mesh's actors do: the handshakes both
        ways then run while the user moves on, not all at once under the first call."""
        dead, mailbox = record["dead"], runtime().mailbox
        procs = (info["proc_meshes"].get(record["proc_mesh"]) or {}).get("procs") or []
        hosts = {procs[r]["host_id"] for r in record["proc_ranks"] if r < len(procs)}
        machines = lambda: len({h.get("hostname") for h in info["hosts"] if h["host_id"] in hosts})  # noqa: E731
        if may_route(len(record["addresses"]), len(hosts), machines):  # its replies come through the routers
            return
        frames = wire_frames.encode(self._info["cluster_id"],
                                    {envelope.KIND: proc_ops.CONNECT, proc_ops.CALLER: mailbox.address})
        for rank, address in enumerate(record["addresses"]):
            if str(rank) not in dead and rank not in dead:
                try:
                    mailbox.send(address, frames)
                except ClusterError:  # (refused: the first call says so)
                    pass

    def _actor_mesh(self, record: dict) -> ActorMesh:
        """A handle from the registry; calls to actors whose proc has exited fail at once."""
        runtime().supervision.sync(self._info["cluster_id"], record["addresses"], record["dead"], record["name"])
        return ActorMesh(self._info["cluster_id"], self._info["hub"], record["proc_mesh"], record["name"],
                         record["class_name"], record["endpoints"], record["methods"],
                         Shape(Extent(record["extent"])), record["addresses"])

    # logs ----------------------------------------------------------------------------
    def flush_logs(self, timeout: float = 5.0) -> bool:
        """Show every line that calls of this client caused and that procs wrote before
        now (the hub drains every host agent's pipes first). Returns False if not all
        arrived within ``timeout`` seconds, or a host's agent did not drain its pipes in
        time (then stderr names the hosts whose lines may come later)."""
        try:
            reply = self.hub.request(hub_ops.LOGS_FLUSH, timeout=timeout, client_id=runtime().client_id)
        except ClusterError:
            return False
        arrived = runtime().lines.wait_for(self._info["cluster_id"], reply["seq"], timeout)
        late = reply.get(hub_ops.UNDRAINED)
        if late:
            print(f"[monarch] lines from {', '.join(late)} may show later: the host agent did not answer the "
                  "flush in time (stalled, or its host is being lost; see cluster.health())", file=sys.stderr)
        return arrived and not late

    def logs(self, mesh: str | None = None, ranks=None, stream: str | None = None, since: float | None = None,
             grep: str | None = None, tail: int | None = None) -> list[dict]:
        """Lines from the hub's store, oldest first, each a dict with ``seq``, ``time``
        (seconds since the epoch), ``host``, ``proc``, ``stream``, ``mesh``, ``rank``,
        ``origin``, ``text`` and ``size`` (actors in the mesh; ``None`` for output not
        written by an actor, which is attributed to the proc mesh and proc rank). Filters: ``mesh`` (actor or proc mesh name), ``ranks``
        (an int or a list), ``stream`` (``"stdout"``/``"stderr"``), ``since`` (epoch
        seconds, or a negative number: that many seconds ago), ``grep`` (a regular
        expression), ``tail`` (the last N). Raises :class:`InvalidRequest` for a bad
        pattern. Works for lines printed before this client connected, and after the
        cluster was stopped (a retained one's store is kept: ``hub.logstore.keep``)."""
        if isinstance(ranks, int):
            ranks = [ranks]
        if since is not None and since < 0:
            since = time.time() + since
        if self._stopped:
            return kept_logs(self.name, mesh=mesh, ranks=ranks, stream=stream, since=since, grep=grep, tail=tail)
        reply = self.hub.request(hub_ops.LOGS_QUERY, timeout=60.0, mesh=mesh, ranks=ranks, stream=stream, since=since,
                                 grep=grep, tail=tail)
        return [dict(zip(LOG_FIELDS, r)) for r in reply["records"]]

    # leaving -------------------------------------------------------------------------
    def disconnect(self) -> None:
        """Stop counting this process as a client (the cluster runs on). Idempotent."""
        attached = runtime().attached
        if attached.get(self._info["cluster_id"]) is self:
            del attached[self._info["cluster_id"]]
        if self._presence is not None:
            self._presence.close()
        if self._debugger is not None:
            self._debugger.close()  # no more debug events for it

    def _leave_at_exit(self) -> None:
        """At interpreter exit: show the lines this client's calls caused that are still
        on their way (a script that exits right after its last call would lose them; a
        cell's end drains them the same way), then disconnect."""
        if self._presence is not None and not self._presence.closed and runtime().touched:
            self.flush_logs(timeout=EXIT_FLUSH_TIMEOUT_S)
        self.disconnect()

    def stop(self) -> None:
        """Stop every proc, host agent and the hub, and remove the cluster's runtime
        files; blocks until they have exited (killing what is left after
        ``STOP_TIMEOUT_S`` seconds). Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._presence is not None and not self._presence.closed:
            self.flush_logs(timeout=2.0)
        self.disconnect()
        # No news of its actors will come from a hub this client stops: calls on them fail here.
        runtime().supervision.cluster_stopped(
            self._info["cluster_id"], f"cluster {self.name!r} was stopped (by this client); its meshes are gone: "
                                      "start or connect to a cluster and spawn them again")
        try:
            self.hub.request(hub_ops.SHUTDOWN, timeout=STOP_TIMEOUT_S)
        except ClusterError:  # the hub is gone or stuck: handled below
            pass
        if self._hub_process is not None:
            try:
                self._hub_process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._hub_process.kill()
                self._hub_process.wait()
        else:
            # Exited is enough: a detached hub is reaped by whoever adopted it, which
            # may take seconds (end_hub would wait for that).
            deadline = time.monotonic() + STOP_TIMEOUT_S
            local = self._info.get("hostname") == socket.gethostname()
            while local and not discovery.hub_process_problem(self._info) and time.monotonic() < deadline:
                time.sleep(0.01)
            discovery.end_hub(self._info)  # killed if it is still running
        discovery.remove_stale(self.path)
        if self.path.parent == cluster_dir.clusters_root():
            cluster_dir.forget_lock(self.name)
        rt = runtime()
        with rt.cluster_lock:
            if rt.cluster is self:
                rt.cluster = None

    def __repr__(self) -> str:
        kind = "ephemeral" if self._hub_process is not None else "retained"
        return f"<Cluster {self.name!r} ({kind}) hub={self._info['hub']}>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        """How IPython shows a cluster: its health tree, as a live widget in a notebook
        plus ``text/html`` and ``text/plain`` (see ``monarch_nb.notebook.health_widget``)."""
        from ..notebook.display import cluster_mimebundle  # display code lives in the notebook layer

        return cluster_mimebundle(self)

    def _ipython_display_(self) -> None:
        """IPython shows a cluster through this (before ``_repr_mimebundle_``): the same
        bundle as ``display_data`` with a ``display_id``, so the kernel can replace a
        live widget by a static snapshot when it restarts."""
        from ..notebook.display import show_cluster

        show_cluster(self)


def _check_config() -> None:
    """Raise ``ValueError`` naming the file and the known keys for a ``config.toml`` a
    new hub would not take (a typo in ``[logs]``, TOML that can't be read), before it
    starts; a hub that meets one later (recovery) runs on with the defaults and says so
    in hub.log. Likewise for a ``MONARCH_NB_MAX_MESSAGE_BYTES`` the processes it starts
    would inherit and fail on at their first message."""
    from ..hub import logstore  # sqlite: not for a client that only connects

    logstore.retention()
    wire_frames.max_message_bytes()


def _check_start_args(name, hosts, grace_s, idle_timeout) -> None:
    cluster_dir.cluster_path(name)  # TypeError/ValueError for a bad name
    if name.startswith(discovery.EPHEMERAL_PREFIX):
        raise ValueError(f"cluster names starting with {discovery.EPHEMERAL_PREFIX!r} are kept for "
                         "scripts' ephemeral clusters; choose another name")
    if hosts is not None and (not isinstance(hosts, int) or hosts < 1):
        raise ValueError(f"hosts={hosts!r}: a cluster needs at least 1 host")
    if not grace_s > 0:
        raise ValueError(f"grace_s={grace_s!r}: give a number of seconds > 0")
    if idle_timeout is not None and not idle_timeout > 0:
        raise ValueError(f"idle_timeout={idle_timeout!r}: give a number of seconds > 0, or None for never")


def _check_local_hosts(hosts: int) -> None:
    """Local hosts are host agent processes on this machine: refuse more than its
    available memory holds (1,000 of them took the machine down for minutes)."""
    need, free = hosts * LOCAL_AGENT_BYTES, psutil.virtual_memory().available
    if need > free:
        raise ValueError(f"hosts={hosts}: local hosts are host agent processes on this machine, "
                         f"~{LOCAL_AGENT_BYTES / 2**20:.0f} MiB each before any proc ({need / 2**30:.1f} GiB), and "
                         f"{free / 2**30:.1f} GiB is available; ask for fewer, or take real hosts from an "
                         "allocator (SlurmAllocator, CommandAllocator)")


def kept_logs(name: str, **filters) -> list[dict]:
    """Lines of the stopped retained cluster ``name`` (its kept store), as
    :meth:`Cluster.logs` gives them, with the same filters (``since`` in epoch seconds).
    Raises :class:`ClusterNotFound` when no store of that name is kept, ``InvalidRequest``
    for a bad pattern."""
    from ..hub import logstore  # sqlite: only for this

    path = cluster_dir.kept_logs_path(name)
    if not path.exists():
        raise ClusterNotFound(f"no log store is kept for a stopped cluster {name!r} (only retained clusters' are, "
                              f"the {logstore.KEPT_STOPPED} stopped last, within the [logs] retention)")
    try:
        records = logstore.read_kept(path, **filters)
    except re.error as e:
        raise InvalidRequest(f"bad --grep pattern {filters.get('grep')!r}: {e}") from None
    return [dict(zip(LOG_FIELDS, r)) for r in records]


def _allocator_spec(allocator, hosts: int | None) -> dict:
    """The spec the hub builds ``allocator`` from (``None``: local host agents)."""
    if allocator is None:
        return {"kind": "local"}
    if not callable(getattr(allocator, "spec", None)) or not hasattr(allocator, "hosts"):
        raise TypeError(f"allocator={allocator!r}: give an allocator such as "
                        "monarch_nb.SlurmAllocator(nodes=2, partition='debug'), or None for local hosts")
    if hosts is not None and hosts != allocator.hosts:
        raise ValueError(f"hosts={hosts} but the allocator gives {allocator.hosts}; leave hosts out "
                         "(the allocator decides, e.g. SlurmAllocator(nodes=...))")
    return allocator.spec()


def _running_hint() -> str:
    running = discovery.running_names()
    return f"; running: {', '.join(running)}" if running else "; no cluster is running"


def connect(name: str | None = None) -> Cluster:
    """Attach to the running retained cluster ``name`` and make ``this_host()`` refer
    to it. ``None``: the only running cluster, else the one named ``default``.

    Raises :class:`ClusterNotFound` (a ``LookupError``) naming the running clusters
    when ``name`` is not running, and saying why when its ``cluster.json`` is stale
    (hub dead or its pid reused); :class:`HubTimeout` when its hub's process is alive
    but does not answer within 2 s (stopped, or too busy)."""
    if name is None:
        running = discovery.running_names()
        if len(running) == 1:
            name = running[0]
        elif DEFAULT_NAME in running or not running:
            name = DEFAULT_NAME
        else:
            raise ClusterNotFound(f"several clusters are running ({', '.join(running)}); "
                                  "pass the name: monarch_nb.connect(NAME)")
    found = discovery.wait_until_started(name)
    if found.state == DiscoveryState.STALE and discovery.hub_alive(found.info):
        raise HubTimeout(f"cluster {name!r}: {found.reason} (stopped, or too busy); try again in a moment. If it "
                         f"stays silent, monarch_nb.Cluster.recover({name!r}, force=True) kills it and starts a "
                         "new hub that re-adopts its procs")
    if found.state == DiscoveryState.STALE:
        hint = (f"recover it with monarch_nb.Cluster.recover({name!r}) (its procs are still alive)"
                if discovery.leftover_agents(found.path) and (found.path / "state.json").exists()
                else f"clear it with `monarch-nb cluster stop {name}`")
        raise ClusterNotFound(f"cluster {name!r} is not running: {found.reason}; {hint}")
    if found.state == DiscoveryState.MISSING:
        start = ("" if name.startswith(discovery.EPHEMERAL_PREFIX)
                 else f". Start one with monarch_nb.Cluster.start({name!r})")
        raise ClusterNotFound(f"no cluster named {name!r}{_running_hint()}{start}")
    if found.state != DiscoveryState.RUNNING:
        raise ClusterNotFound(f"cluster {name!r} is not running: {found.reason}")
    current = runtime().cluster
    if current is not None and current._info == found.info and not current._stopped:
        return current  # already connected to this very hub
    return Cluster(name, found.path, found.info)._attach()


def list_clusters() -> list[dict]:
    """Every cluster under ``MONARCH_NB_HOME``: ``name``, ``state`` (``running`` or
    ``stale``), ``reason`` (why stale), ``ephemeral`` (a script's own cluster) and,
    when running, ``info`` (the hub's answer: hosts, clients, meshes, start time).

    What is left of an ephemeral cluster whose script was killed (its directory) is
    removed here once none of its processes runs."""
    listed = []
    for found in (discovery.probe(n) for n in discovery.names()):
        ephemeral = discovery.is_ephemeral(found)
        if found.state == DiscoveryState.STALE and ephemeral and not discovery.leftover_agents(found.path):
            discovery.remove_stale(found.path)
        elif found.state != DiscoveryState.MISSING:
            listed.append({"name": found.name, "state": found.state, "reason": found.reason,
                           "ephemeral": ephemeral, "path": str(found.path), "info": found.hub_info})
    return listed


class _ProcMeshes(dict):
    def __missing__(self, name):
        raise KeyError(f"no proc mesh {name!r} (proc meshes: {', '.join(sorted(self)) or 'none'})")


def default_cluster() -> Cluster:
    """The cluster ``this_host()`` refers to: the connected one, else an ephemeral one
    started on first use."""
    rt = runtime()
    with rt.cluster_lock:
        if rt.cluster is None:
            in_proc = proc_identity()
            if in_proc is None:
                rt.cluster = Cluster.start_ephemeral()
            else:  # an actor spawning meshes: in its own cluster, as a client of its hub
                path = Path(in_proc["cluster_dir"])
                info = cluster_dir.read_info(path)
                rt.cluster = Cluster(info["name"], path, info)
                rt.cluster._presence = join_hub(info["cluster_id"], info["hub"])
        return rt.cluster


def shutdown_context() -> Future[None]:
    """Release what this client holds, as Monarch's ``shutdown_context()``: this
    script's own (ephemeral) cluster is stopped with all its procs, as at exit; a
    connected retained cluster keeps running (it outlives clients by design) and this
    client disconnects from it. The next ``this_host()`` starts or connects anew.
    Idempotent; blocks until done; returns a finished ``Future[None]``."""
    rt = runtime()
    with rt.cluster_lock:
        cluster, rt.cluster = rt.cluster, None
    if cluster is not None and cluster._hub_process is not None:
        cluster.stop()
    elif cluster is not None:
        cluster.disconnect()
    return Future.finished(rt, "shutdown_context")


def this_host() -> HostMesh:
    """The hosts of the current cluster: one host has no dimensions (extent ``{}``, as
    in Monarch), N > 1 hosts have extent ``{"hosts": N}`` (see ``Cluster.this_host``).

    After ``connect()`` or ``Cluster.start()`` it is that cluster's. In a script with
    no cluster connected this starts an ephemeral local cluster that is torn down when
    the script exits. Blocks until the cluster is up (~0.2 s)."""
    return default_cluster().this_host()
