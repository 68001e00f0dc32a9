"""A service's replicas over their lives (the half of ``Service`` that is not routing):
started on threads of their own, marked failed on supervision's news of their actors,
replaced (new procs and actor; or, for a service adopted after a kernel restart,
restarted in place), left ``UNHEALTHY`` past its restart budget (``restarts``), and
recorded with the hub so that the health tree and later clients know them
(``protocol.services``).

Nothing polls: ``actors_gone`` events, and calls that failed with ``SupervisionError``,
are what mark a replica failed.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..client.actor_mesh import ActorMesh
from ..client.host_mesh import HostMesh
from ..client.runtime import runtime
from ..protocol import envelope, events, services
from . import health_checks
from .endpoint_config import EndpointConfig
from .errors import ServiceError
from .replica import Replica, ReplicaState
from .restarts import replica_mesh_name
from .sessions import Sessions

# A failed start is tried again after this long, twice as long after each failure in a row
# (at most RETRY_MAX_S): a replacement that fails for a passing reason (GPU memory not yet
# freed, a file not yet written) does not spend every restart the budget allows at once.
RETRY_S = 0.5
RETRY_MAX_S = 8.0


class ReplicaLifecycle:
    """What ``Service`` does to keep its replicas serving (a base of ``Service``, which
    sets these attributes in ``Service._setup``)."""

    name: str
    replicas: list[Replica]
    _key: str
    _cluster_id: str
    _class: type | None
    _class_name: str
    _args: tuple
    _kwargs: dict
    _configs: dict[str, EndpointConfig]
    _procs: int
    _max_restarts: int
    _restart_window_s: float | None
    _on_start: Callable[[Replica], None] | None
    _hosts: HostMesh
    _lock: threading.RLock
    _changed: threading.Condition
    _by_mesh: dict[str, Replica]
    _gone: set[str]
    _handled: list[str]
    _sessions: Sessions
    _stopped: bool
    _threads: list[threading.Thread]

    def _release_waiting(self) -> None:
        raise NotImplementedError  # Service's: requests that waited for a healthy replica

    def _on_event(self, header: dict) -> None:
        """A hub event, on the event thread (no blocking). On news of dead actors (which
        supervision, subscribed first, has recorded already) the replicas whose actors
        it names are marked failed; ``initialized`` asks supervision about each current
        actor mesh, a lookup per replica."""
        if header.get(envelope.OP) != events.ACTORS_GONE:
            return
        for mesh, replica in list(self._by_mesh.items()):
            actors = replica.actors
            gone = actors.initialized.exception() if actors is not None and actors._name == mesh else None
            if gone is not None:
                self._failed_replica(replica, mesh, str(gone))

    def _replica_died(self, replica: Replica, generation: int) -> bool:
        """Whether the failed call's replica (``generation`` of it) is known gone
        (supervision has heard; then recovery starts here if the event is not in yet)."""
        with self._lock:
            if replica.generation != generation:
                return True  # replaced already
            actors = replica.actors
        if actors is None:
            return True
        gone = actors.initialized.exception()
        if gone is None:
            return False
        self._failed_replica(replica, actors._name, str(gone))
        return True

    def _failed_replica(self, replica: Replica, mesh: str, why: str) -> None:
        with self._lock:
            self._gone.add(mesh)
            if self._stopped or self._by_mesh.get(mesh) is not replica or replica.state is not ReplicaState.HEALTHY:
                return  # old news, or a start under way sees it (self._gone)
            del self._by_mesh[mesh]
            replica.last_failure = _first_cause(why)
            replica.failed_at = time.monotonic()
            self._sessions.replica_failed(replica.idx)
            spent = not replica.budget.allows(time.monotonic())
            # Spent: out until its window frees a restart (_start waits for that).
            replica.state = ReplicaState.UNHEALTHY if spent else ReplicaState.RECOVERING
            self._changed.notify_all()
            self._start_thread(replica, broken=replica.procs)
        if spent:
            self._release_waiting()  # requests waiting for it may have nowhere to go

    def _start_thread(self, replica: Replica, broken: Any) -> None:
        thread = threading.Thread(target=self._start, args=(replica, broken), daemon=True,
                                  name=f"monarch-nb-service-{self._key}-r{replica.idx}")
        with self._lock:  # the loop in a method of its own: see monarch_nb.wire.interrupts
            self._threads = self._running_threads() + [thread]
        thread.start()

    def _running_threads(self) -> list[threading.Thread]:
        """The replica threads still running (the caller holds the lock)."""
        return [t for t in self._threads if t.is_alive()]

    def _start(self, replica: Replica, broken: Any) -> None:
        """Start ``replica`` (again, after ``broken``, its failed procs, are stopped):
        new procs, the actor, the hook. A failed attempt is retried while the restart
        budget allows (each attempt after the first start counts as a restart), then the
        replica is left ``UNHEALTHY``."""
        if self._class is None:
            self._restart_in_place(replica)
            return
        if broken is not None:
            self._stop_procs(broken)  # its live ranks too
        failed = 0  # starts that failed in a row
        while True:
            if failed:
                self._pause(min(RETRY_MAX_S, RETRY_S * 2 ** (failed - 1)))
            with self._lock:
                if self._stopped:
                    return
                spent = replica.generation > 0 and not self._take_restart(replica)  # not its first start
            if spent:
                if not self._wait_out_budget(replica):
                    break
                failed = 0
                continue
            with self._lock:
                replica.generation += 1
                mesh = replica_mesh_name(self._key, replica.idx, replica.generation)
                self._gone.discard(mesh)  # a name used again: its older mesh's death is not this one's
                self._handle_failures_of(mesh)
                record = self._record(replica.idx, replica.generation)
            procs = None
            try:
                # replace=True: a mesh of that name still registered (an earlier stop failed) is
                # stopped, where the hub would hand it back as if it were the new one
                procs = self._hosts.spawn_procs(per_host={"procs": self._procs}, name=mesh, replace=True,
                                                _service=record)
                actors: Any = procs.spawn(mesh, self._class, *self._args, raise_init_errors=True, **self._kwargs)
                with self._lock:
                    replica.serve_from(procs, actors)
                    mesh = actors._name  # (the name asked for: the client owns it)
                    self._by_mesh[mesh] = replica
                if self._on_start is not None:
                    self._on_start(replica)
                if self._serve_when_caught_up(replica, mesh):
                    break
            except Exception as e:  # noqa: BLE001 - counted against the budget; the others serve meanwhile
                with self._lock:
                    self._by_mesh.pop(mesh, None)
                    replica.last_failure = f"start failed: {_describe(e)}"
                    if replica.state is not ReplicaState.INITIALIZING:
                        replica.failed_at = replica.failed_at or time.monotonic()
                if procs is not None:
                    self._stop_procs(procs)
                failed += 1
                continue
            # stopped while it started: shutdown() has passed this replica, or waits on us
            if procs is not None:
                self._stop_procs(procs)
            return
        self._release_waiting()

    def _take_restart(self, replica: Replica) -> bool:
        """Count a restart of ``replica`` now if its budget allows one; else leave it
        out (``UNHEALTHY``: see :meth:`_wait_out_budget`). Returns whether it may restart.
        The caller holds the lock."""
        now = time.monotonic()
        if not replica.budget.allows(now):
            replica.state = ReplicaState.UNHEALTHY
            self._changed.notify_all()
            return False
        replica.budget.spend(now)
        replica.restarts += 1
        return True

    def _wait_out_budget(self, replica: Replica) -> bool:
        """``replica`` is left ``UNHEALTHY``, its restart budget spent: wait until its
        window frees a restart, then mark it ``RECOVERING`` and return True to try again;
        False (out for good) with no window, or once the service is shut down."""
        self._release_waiting()
        at = replica.budget.next_allowed()
        if at is None:
            return False
        self._pause(at - time.monotonic())
        with self._lock:
            if self._stopped:
                return False
            replica.state = ReplicaState.RECOVERING
            self._changed.notify_all()
        return True

    def _fanout_args(self, endpoint: str, args: tuple, kwargs: dict) -> tuple:
        raise NotImplementedError  # Service's

    def _serve_when_caught_up(self, replica: Replica, mesh: str) -> bool:
        """Send ``replica`` (started, its hook run) the fanouts it missed while it was
        being replaced, then mark it healthy; False when the service stopped meanwhile.
        A fanout made while the hook ran (new weights) reached the other replicas only,
        and the replacement served what the hook had loaded: stale weights, silently.
        Raises (a failed start) when a replayed call raises or its actor died."""
        while True:
            with self._lock:
                missed, replica.missed = replica.missed, []
                if not missed:
                    if mesh in self._gone:
                        raise ServiceError("its actor died while it started")
                    if self._stopped:
                        return False
                    if replica.state is ReplicaState.RECOVERING:
                        replica.recoveries_s.append(time.monotonic() - replica.failed_at)
                    replica.state = ReplicaState.HEALTHY
                    self._changed.notify_all()
                    return True
            self._replay(replica, missed)

    def _replay(self, replica: Replica, missed: list) -> None:
        """Call ``replica`` with each of ``missed`` (endpoint, args, kwargs), in order;
        what a call raises fails the start, and the next start sends it and the rest
        again."""
        for i, (endpoint, args, kwargs) in enumerate(missed):
            try:
                replica.adverb(endpoint)(*self._fanout_args(endpoint, args, kwargs), **kwargs).get()
            except BaseException:
                with self._lock:
                    replica.missed[:0] = missed[i:]
                raise

    def _health_targets(self) -> list[health_checks.Target]:
        """The procs of the healthy replicas, for a round of health checks."""
        with self._lock:  # the loop in a method of its own: see monarch_nb.wire.interrupts
            return self._healthy_targets()

    def _healthy_targets(self) -> list[health_checks.Target]:
        """The caller holds the lock."""
        targets = []
        for replica in self.replicas:
            if replica.state is not ReplicaState.HEALTHY or replica.procs is None or replica.actors is None:
                continue
            key = (replica.idx, replica.generation, replica.actors._name)
            for proc in replica.procs._procs:
                targets.append(health_checks.Target(key, proc["address"],
                                                    f"proc {proc['proc_id']} (pid {proc['pid']})"))
        return targets

    def _failed_check(self, key: tuple, why: str) -> None:
        """A health check found replica ``key`` (index, generation, actor mesh) silent:
        failed and replaced, as a replica whose proc died (no-op if it was already)."""
        idx, generation, mesh = key
        replica = self.replicas[idx]
        with self._lock:
            current = replica.generation == generation
        if current:
            self._failed_replica(replica, mesh, why)

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or until the service is shut down."""
        deadline = time.monotonic() + seconds
        while not self._stopped and (left := deadline - time.monotonic()) > 0:
            with self._lock:
                if not self._stopped:
                    self._changed.wait(left)

    def _restart_in_place(self, replica: Replica) -> None:
        """Replace an adopted service's failed ``replica`` (this client has no class to
        spawn a new mesh from): its procs are restarted, and the hub makes its actor again
        from the constructor arguments it kept; then the hook. Within the restart budget,
        as :meth:`_start`."""
        while True:
            with self._lock:
                if self._stopped:
                    return
                if replica.actors is None:
                    replica.state = ReplicaState.UNHEALTHY
                    self._changed.notify_all()
                    break
                spent = not self._take_restart(replica)
            if spent:
                if not self._wait_out_budget(replica):
                    break
                continue
            with self._lock:
                replica.generation += 1
                actors, procs = replica.actors, replica.procs
                mesh = actors._name
                self._gone.discard(mesh)
            try:
                ActorMesh.restart(actors, list(range(len(actors))))  # every rank: a live one of a broken replica too
                with self._lock:
                    replica.serve_from(procs, actors)
                    self._by_mesh[mesh] = replica
                if self._on_start is not None:
                    self._on_start(replica)
                if not self._serve_when_caught_up(replica, mesh):
                    return
                break
            except Exception as e:  # noqa: BLE001 - counted against the budget
                with self._lock:
                    self._by_mesh.pop(mesh, None)
                    replica.last_failure = f"restart failed: {_describe(e)}"
        self._release_waiting()

    def _handle_failures_of(self, mesh: str) -> None:
        """Tell supervision that this service handles the failures of ``mesh`` (its
        replica's proc and actor mesh): replacing a replica is this service's job, not
        something to print under the cell. The caller holds the lock."""
        if mesh not in self._handled:  # (a name used again: see restarts.GENERATION_SLOTS)
            self._handled.append(mesh)
        runtime().supervision.mark_handled(self._cluster_id, [mesh], f"service {self.name!r}")

    def _record(self, idx: int, generation: int) -> dict:
        """What the hub keeps of replica ``idx`` (``generation``) with its proc mesh."""
        return {services.NAME: self.name, services.KEY: self._key, services.CLASS: self._class_name,
                services.REPLICA: idx, services.REPLICAS: len(self.replicas), services.GENERATION: generation,
                services.PROCS: self._procs, services.MAX_RESTARTS: self._max_restarts,
                services.RESTART_WINDOW_S: self._restart_window_s,
                services.ENDPOINTS: {name: {services.BATCH_SIZE: c.batch_size, services.BATCH_TIMEOUT: c.batch_timeout,
                                            services.IDEMPOTENT: c.idempotent, services.ROUTER: _router_name(c.router)}
                                     for name, c in self._configs.items()}}

    def _stop_procs(self, procs: Any) -> None:
        try:
            procs.stop()
        except Exception:  # noqa: BLE001 - already gone (its host, the cluster): nothing left to stop
            pass


def _router_name(router: Any) -> str | None:
    """The class name of an endpoint's router (``None``: the default)."""
    if router is None:
        return None
    return (router if isinstance(router, type) else type(router)).__name__


def _first_cause(why: str) -> str:
    """The line of a supervision report that says what happened to a rank (its first
    lines only name the mesh)."""
    lines = [line.strip() for line in (why or "").splitlines() if line.strip()]
    return next((line for line in lines if " rank " in line), lines[-1] if lines else "its actor is gone")


def _describe(error: BaseException) -> str:
    """``Type: message`` of what failed a start, naming the original exception of an
    ``ActorError`` (an ``__init__`` or the hook's call that raised in an actor)."""
    cause = getattr(error, "exception", None)
    where = f" (in {type(error).__name__})" if isinstance(cause, BaseException) else ""
    error = cause if isinstance(cause, BaseException) else error
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}{where}"
