"""``Service``: ``num_replicas`` copies of an actor class, each on its own proc mesh,
behind one handle whose endpoints ``route()`` a call to one healthy replica or
``fanout()`` it to all of them.

Replica health follows supervision: the hub's ``actors_gone`` news of a replica's actor
(its proc was killed, it crashed, its host was lost) marks the replica failed the moment
it arrives, and a thread of the service replaces it (new procs, new actor, the
``on_replica_start`` hook) while the others serve. Nothing polls. A call that was in
flight on the failed replica fails with ``SupervisionError`` and, unless its endpoint is
marked ``idempotent=False``, runs once more on a healthy replica; callers see only the
result.

Calls go straight from this client to the chosen replica's actor (the service adds a
router pick and a done-callback to an ordinary endpoint call); the service is not an
actor and there is no hop through one.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
import warnings
from collections.abc import Callable, Generator
from typing import Any, Hashable

from .. import cluster_dir
from ..client.call_each import call_one_each
from ..client.cluster import this_host
from ..client.future import Future
from ..client.host_mesh import HostMesh
from ..client.runtime import runtime
from ..errors import SupervisionError
from . import defaults, health_checks, restarts
from .batcher import Batcher
from .calls import FanIn, Request, batch_unpacker, to_batch, to_future
from .endpoint import ServiceEndpoint
from .endpoint_config import EndpointConfig, endpoint_configs
from .lifecycle import ReplicaLifecycle
from .errors import NoHealthyReplica, ServiceError, ServiceStopped, SessionMoved
from .metrics import ServiceMetrics
from .replica import Replica, ReplicaState
from .routers import Router, make_router
from .sessions import SessionContext, Sessions, current_session

SESSION_KWARG = "sess_id"  # route(..., sess_id=SID): TorchForge's way to name a session per call
STARTING = (ReplicaState.INITIALIZING, ReplicaState.RECOVERING)


class Service(ReplicaLifecycle):
    """``num_replicas`` replicas of ``actor_class(*args, **kwargs)``, each a proc mesh of
    ``procs`` procs (extent ``{"procs": procs}`` per host of ``hosts``, default
    ``this_host()``) with the actor spawned on it. Made by
    ``Cls.options(procs=..., num_replicas=...).as_service(*args, **kwargs)``.

    Returns at once: replicas start on threads of their own (``await svc`` or
    ``svc.wait_ready()`` waits for them; calls made before wait in the service).
    ``on_replica_start(replica)`` runs after each start of a replica, first or after a
    replacement, before it serves (e.g. to load weights into ``replica.actors``); what
    it raises counts as a failed start. A replica is replaced at most ``max_restarts``
    times (failed starts included) within any ``restart_window_s`` seconds (``None``:
    within the service's whole life); one that fails past that is left ``UNHEALTHY``.
    Raises ``ValueError``/``TypeError`` for bad options, naming the option and the fix.
    """

    def __init__(self, actor_class: type, args: tuple, kwargs: dict, *, procs: int = 1, num_replicas: int = 1,
                 hosts: HostMesh | None = None, name: str | None = None, max_restarts: int = defaults.MAX_RESTARTS,
                 on_replica_start: Callable[[Replica], None] | None = None,
                 health_check_period_s: float | None = health_checks.PERIOD_S,
                 health_check_timeout_s: float = health_checks.TIMEOUT_S,
                 restart_window_s: float | None = defaults.RESTART_WINDOW_S):
        for what, value, least in (("procs", procs, 1), ("num_replicas", num_replicas, 1),
                                   ("max_restarts", max_restarts, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{actor_class.__name__}.options({what}={value!r}): give an int >= {least}")
        for what, seconds, none_means in (("health_check_period_s", health_check_period_s, "no health checks"),
                                          ("health_check_timeout_s", health_check_timeout_s, None),
                                          ("restart_window_s", restart_window_s,
                                           "max_restarts counts over the service's whole life")):
            if (seconds is not None or none_means is None) and (
                    isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0):
                raise ValueError(f"{actor_class.__name__}.options({what}={seconds!r}): give seconds > 0"
                                 + (f" (or None: {none_means})" if none_means else ""))
        if hosts is not None and not isinstance(hosts, HostMesh):
            raise TypeError(f"{actor_class.__name__}.options(hosts={hosts!r}): give a HostMesh (e.g. "
                            "cluster.host_mesh()) or None for this_host()")
        if on_replica_start is not None and not callable(on_replica_start):
            raise TypeError(f"on_replica_start={on_replica_start!r} is not callable; give a function (replica) -> None")
        configs = endpoint_configs(actor_class)
        if not configs:
            raise TypeError(f"{actor_class.__name__} has no endpoints to serve; mark methods with @endpoint "
                            "or @service_endpoint")
        self._class: type | None = actor_class
        self._args, self._kwargs = args, kwargs
        name = name or actor_class.__name__.lower()
        # The key is unique in the cluster: replicas' meshes are named after it, and their
        # deaths are recognised by those names.
        key = f"{name}-{secrets.token_hex(3)}"
        longest = restarts.longest_mesh_name(key, num_replicas)  # however many restarts
        if not isinstance(name, str) or not cluster_dir.is_valid_name(longest):
            room = cluster_dir.MAX_NAME_CHARS - (len(longest) - len(str(name)))
            raise ValueError(f"{actor_class.__name__}.options(name={name!r}): the name of a service names its "
                             f"replicas' meshes (as {longest!r}); give 1-{room} letters, digits, '_', '.' or '-', "
                             "starting with a letter or digit")
        self._setup(name, key, configs, num_replicas, procs, max_restarts,
                    on_replica_start, hosts if hosts is not None else this_host(),
                    f"{actor_class.__module__}.{actor_class.__qualname__}",
                    (health_check_period_s, health_check_timeout_s), restart_window_s)
        for replica in self.replicas:
            self._start_thread(replica, broken=None)
        if self._health is not None:
            self._health.start()

    def _setup(self, name: str, key: str, configs: dict[str, EndpointConfig], num_replicas: int, procs: int,
               max_restarts: int, on_replica_start: Callable[[Replica], None] | None, hosts: HostMesh,
               class_name: str, checks: tuple[float | None, float] = (health_checks.PERIOD_S,
                                                                      health_checks.TIMEOUT_S),
               restart_window_s: float | None = defaults.RESTART_WINDOW_S) -> None:
        """The state of a new service or of one adopted from the hub's records.
        ``checks``: the health checks' period (``None``: none) and timeout, in seconds;
        each replica may be replaced ``max_restarts`` times within ``restart_window_s``."""
        self.name, self._key, self._configs, self._class_name = name, key, configs, class_name
        self._procs, self._on_start = procs, on_replica_start
        self._max_restarts, self._restart_window_s = max_restarts, restart_window_s
        self._routers: dict[str, Router] = {n: make_router(c.router) for n, c in self._configs.items()}
        # No loop runs directly in a `with self._lock:` (or `self._changed`) block: each is
        # in a method of its own called under the lock. On Python 3.12+ a loop's back-edge
        # there can fall outside the block's exception handler, and a Ctrl-C raised at it by
        # a SIGINT handler of the user's own would leave the lock held (see
        # monarch_nb.wire.interrupts).
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self.replicas = [Replica(i, budget=restarts.RestartBudget(max_restarts, restart_window_s))
                         for i in range(num_replicas)]
        self._by_mesh: dict[str, Replica] = {}  # current actor mesh name -> its replica
        self._gone: set[str] = set()  # our actor meshes reported gone
        self._waiting: list[Request] = []  # routed while no replica was healthy
        self._fanouts: list[Callable[[], None]] = []  # fanouts waiting for the first starts to end
        self._sessions = Sessions(self.name)
        self._retried = 0
        self._failed = 0
        self._stopped = False
        self._threads: list[threading.Thread] = []
        self._batcher = Batcher(self._send_batch, self._key) if any(c.batching for c in self._configs.values()) else None
        self._hosts = hosts
        self._cluster_id: str = hosts._cluster_id
        self._handled: list[str] = []  # meshes whose failures supervision leaves to this service
        self._unsubscribe = runtime().events.subscribe(self._on_event)
        runtime().services.add(self._cluster_id, self._key, self)
        period, timeout = checks
        self._health = None if period is None else health_checks.HealthChecks(
            self._key, self._cluster_id, period, timeout, self._health_targets, self._failed_check,
            lambda: self._stopped, self._pause)

    # -- public --------------------------------------------------------------------------
    def __getattr__(self, name: str) -> ServiceEndpoint:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._configs:
            return ServiceEndpoint(self, name)
        raise AttributeError(f"service {self.name!r} ({self._short_class}) has no endpoint {name!r} "
                             f"(endpoints: {', '.join(sorted(self._configs))})")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._configs))

    def wait_ready(self, timeout: float | None = None) -> "Service":
        """Block until no replica is starting for the first time (``timeout`` seconds,
        ``None``: no limit); returns the service. Raises ``TimeoutError`` past the
        timeout and :class:`NoHealthyReplica` when no replica could start."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            starting = self._wait_out((ReplicaState.INITIALIZING,), deadline)
            if starting:
                raise TimeoutError(f"service {self.name!r}: replicas still starting after {timeout} s: {starting}")
            self._check_running()  # (shut down: said so, not as replicas that could not start)
            if not any(r.state in (ReplicaState.HEALTHY, ReplicaState.RECOVERING) for r in self.replicas):
                raise NoHealthyReplica(f"service {self.name!r}: no replica could start: " + "; ".join(
                    f"replica {r.idx}: {r.last_failure or r.state.value}" for r in self.replicas))
        return self

    def __await__(self) -> Generator[Any, None, "Service"]:
        loop = asyncio.get_running_loop()
        return (yield from loop.run_in_executor(None, self.wait_ready).__await__())

    def wait_healthy(self, timeout: float | None = None) -> bool:
        """Block until no replica is starting or being replaced (``timeout`` seconds);
        returns whether every replica not out past its restart budget is healthy."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            return not self._wait_out(STARTING, deadline)

    def _wait_out(self, states: tuple[ReplicaState, ...], deadline: float | None) -> list[int]:
        """Wait on ``self._changed`` (the caller holds it) until no replica is in one of
        ``states`` or ``deadline`` (``time.monotonic()``; ``None``: no limit) passes; the
        indexes of the replicas still in them (empty when none is)."""
        while True:
            left_in = [r.idx for r in self.replicas if r.state in states]
            left = None if deadline is None else deadline - time.monotonic()
            if not left_in or (left is not None and left <= 0):
                return left_in
            self._changed.wait(left)

    def session(self, session_id: str | None = None) -> SessionContext:
        """``with svc.session():`` / ``async with svc.session():``: the block's calls to
        this service (in this thread or task) go to one replica. Starts a session and
        terminates it on exit; give ``session_id`` to enter one from
        :meth:`start_session` instead (left open on exit)."""
        return SessionContext(self, session_id)

    def start_session(self) -> str:
        """A new session id: ``route(..., sess_id=SID)`` calls go to one replica (chosen
        at the first call, least loaded) until :meth:`terminate_session`. If that replica
        fails, the session moves to another one and a :class:`SessionMoved` warning says
        so. Raises :class:`ServiceStopped` after shutdown."""
        with self._lock:
            self._check_running()
            return self._sessions.start()

    def terminate_session(self, sess_id: str, missing_ok: bool = False) -> None:
        """End session ``sess_id``. Raises :class:`UnknownSession` for one never started
        or already terminated (unless ``missing_ok``)."""
        with self._lock:
            self._sessions.terminate(sess_id, missing_ok)

    def session_replica(self, sess_id: str) -> int | None:
        """Index of the replica serving session ``sess_id`` (``None`` before its first
        call). Raises :class:`UnknownSession` as :meth:`terminate_session`."""
        with self._lock:
            return self._sessions.replica_of(sess_id)

    def get_metrics(self) -> ServiceMetrics:
        """Per replica: state, requests, failed, in flight, latency p50/p99 (s),
        restarts, pids (of a healthy replica's procs); for the service: sessions,
        waiting, retried (sent again to another replica) and failed (their caller got an
        error) requests. See :class:`ServiceMetrics`."""
        with self._lock:
            return ServiceMetrics(self.name, self._replica_metrics(), len(self._sessions),
                                  len(self._waiting), self._retried, self._failed)

    def _replica_metrics(self) -> list[dict]:
        """Each replica's metrics (the caller holds the lock)."""
        return [r.metrics() for r in self.replicas]

    def shutdown(self, timeout: float = 120.0) -> Future:
        """Stop every replica's procs (and the actors on them); requests still waiting
        for a replica or a batch, and routes and fanouts in flight, fail with
        :class:`ServiceStopped`; later calls raise it.
        Waits up to ``timeout`` seconds for replicas being started to finish starting
        (then stops them too). Blocks until done; returns a finished ``Future[None]`` (to
        ``await`` or ignore). A second call does nothing."""
        with self._lock:
            if self._stopped:
                return Future.finished(runtime(), f"{self.name}.shutdown")
            self._stopped = True
            waiting, self._waiting = self._waiting, []
            fanouts, self._fanouts = self._fanouts, []
            self._changed.notify_all()
        self._unsubscribe()
        left = self._batcher.close() if self._batcher is not None else []
        stopped = ServiceStopped(f"service {self.name!r} was shut down")
        for request in waiting + left:
            self._give_up(request, stopped)
        for run in fanouts:
            run()
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            if thread is not threading.current_thread():  # (called from on_replica_start: it ends after)
                thread.join(max(0.0, deadline - time.monotonic()))
        for replica in self.replicas:
            with self._lock:
                procs, replica.state = replica.procs, ReplicaState.STOPPED
            if procs is not None:
                self._stop_procs(procs)
        with self._changed:
            self._changed.notify_all()
        rt = runtime()
        rt.supervision.mark_handled(self._cluster_id, self._handled, None)
        rt.services.remove(self._cluster_id, self._key)
        return Future.finished(rt, f"{self.name}.shutdown")

    stop = shutdown

    def replica_load(self) -> list[dict]:
        """Per replica: ``state`` and what this client routed to it (``requests``,
        ``in_flight``, ``latency_p50_s``/``latency_p99_s`` in seconds, ``restarts``); what
        ``Cluster.health()`` adds to the hub's view of the replicas."""
        return self.get_metrics().replicas

    @property
    def _short_class(self) -> str:
        return self._class_name.rpartition(".")[2]

    def __repr__(self) -> str:
        states = ", ".join(r.state.value for r in self.replicas)
        return f"<Service {self.name!r} {self._short_class} x{len(self.replicas)} [{states}]>"

    # -- routing -------------------------------------------------------------------------
    def _check_running(self) -> None:
        if self._stopped:
            raise ServiceStopped(f"service {self.name!r} was shut down; make a new one with "
                                 f"{self._short_class}.options(...).as_service(...)")

    def _check_session(self, sess_id: str) -> None:
        self._sessions.check(sess_id)

    def _route(self, endpoint: str, args: tuple, kwargs: dict) -> Future:
        sess_id = kwargs.pop(SESSION_KWARG, None)
        if sess_id is None:
            sess_id = current_session(self._key)
        config = self._configs[endpoint]
        with self._lock:
            self._check_running()
            if sess_id is not None:
                self._check_session(sess_id)
            if config.batching and not any(r.state is ReplicaState.HEALTHY or r.state in STARTING
                                           for r in self.replicas):
                raise NoHealthyReplica(f"service {self.name!r}: every replica is out, past its restart budget (each is "
                                       "tried again once restart_window_s frees a restart); see get_metrics()")
        future: Future = Future(runtime(), f"{self.name}.{endpoint}.route")
        if config.batching:
            if kwargs or len(args) != 1:
                raise TypeError(f"{self.name}.{endpoint} batches requests (batch_size={config.batch_size}): route() "
                                f"takes one request argument, got {len(args)} positional and {sorted(kwargs)} keyword")
            assert self._batcher is not None
            try:
                self._batcher.add((endpoint, sess_id), (args[0], future), config.batch_size, config.batch_timeout)
            except RuntimeError:
                self._check_running()
                raise
            return future
        request = Request(endpoint, args, kwargs, config, to_future(future), sess_id)
        replica = self._pick(request)  # raises now: nothing healthy, or none can ever be
        if replica is not None:
            self._send(request, replica)
        return future

    def _send_batch(self, key: Hashable, items: list) -> None:
        """A full or timed-out batch: one call taking the list of its requests."""
        endpoint: str = key[0]  # type: ignore[index]
        sess_id: str | None = key[1]  # type: ignore[index]
        deliver = to_batch([future for _, future in items])
        self._submit(Request(endpoint, ([item for item, _ in items],), {}, self._configs[endpoint], deliver,
                             sess_id, count=len(items), unpack=batch_unpacker(len(items), f"{self.name}.{endpoint}")))

    def _submit(self, request: Request) -> None:
        """Send ``request`` to a replica, or keep it until one is healthy; what can't
        be served is delivered as an error."""
        try:
            replica = self._pick(request)
        except ServiceError as e:
            self._give_up(request, e)
            return
        if replica is not None:
            self._send(request, replica)

    def _pick(self, request: Request) -> Replica | None:
        """The replica to serve ``request`` (counted in flight on it), or ``None`` when
        it was kept for later. Raises :class:`ServiceStopped` or
        :class:`NoHealthyReplica`."""
        moved: list[tuple[str, int, int]] = []
        with self._lock:
            self._check_running()
            healthy = self._healthy(request.exclude)
            if not healthy:
                if any(r.state in STARTING for r in self.replicas):
                    self._waiting.append(request)
                    return None
                raise NoHealthyReplica(f"service {self.name!r}: no healthy replica to serve {request.endpoint!r}; "
                                       + "; ".join(f"replica {r.idx} {r.state.value}: {r.last_failure or '-'}"
                                                   for r in self.replicas))
            sess_id = request.sess_id
            if sess_id is not None and sess_id in self._sessions:
                replica, moved = self._sessions.pick(healthy, sess_id)
            else:
                replica = self._routers[request.endpoint].get_replica(healthy)
            replica.stats.in_flight += request.count
            replica.stats.requests += request.count
            request.attempts += 1
            if request.exclude:  # sent again, after its replica died under it
                self._retried += request.count
        for sid, was, now in moved:
            warnings.warn(SessionMoved(f"service {self.name!r}: session {sid} moved from replica {was}, which failed, "
                                       f"to replica {now}; state replica {was} kept for it is gone"), stacklevel=2)
        return replica

    def _healthy(self, exclude: set[tuple[int, int]] | frozenset = frozenset()) -> list[Replica]:
        """The healthy replicas but those whose (index, generation) is in ``exclude``
        (the caller holds the lock)."""
        return [r for r in self.replicas if r.state is ReplicaState.HEALTHY and (r.idx, r.generation) not in exclude]

    def _send(self, request: Request, replica: Replica) -> None:
        generation = replica.generation
        started = time.perf_counter()
        try:
            call = replica.adverb(request.endpoint)(*request.args, **request.kwargs)
        except Exception as e:  # noqa: BLE001 - e.g. an armed failure, an argument that can't be pickled
            self._finished(request, replica, generation, started, None, e)
            return
        self._on_reply(request, replica, generation, started, call)

    def _on_reply(self, request: Request, replica: Replica, generation: int, started: float, call: Future) -> None:
        """When ``call`` (``request`` sent to ``generation`` of ``replica`` at ``started``,
        ``time.perf_counter()``) is done: :meth:`_finished`."""

        def done(f: Future) -> None:
            try:
                value, error = f.get(0), None
            except BaseException as e:  # noqa: BLE001 - the caller's future raises it
                value, error = None, e
            self._finished(request, replica, generation, started, value, error)

        call.add_done_callback(done)

    def _finished(self, request: Request, replica: Replica, generation: int, started: float,
                  value: Any, error: BaseException | None) -> None:
        """A replica answered ``request`` (or failed it): deliver, or retry once."""
        if error is None and request.unpack is not None:
            try:
                value = request.unpack(value)
            except ServiceError as e:  # (a batch's results not one per request): counted as failed below
                error = e
        latency = time.perf_counter() - started
        with self._lock:
            stats = replica.stats
            stats.in_flight -= request.count
            stats.latencies.extend([latency] * request.count)
            if error is not None:
                stats.failed += request.count
        if error is None:
            request.deliver(value, None)
            return
        if isinstance(error, SupervisionError) and self._stopped:  # shutdown() stopped its procs under it
            self._give_up(request, self._stopped_under(replica, error))
            return
        if isinstance(error, SupervisionError) and self._replica_died(replica, generation):
            if request.config.idempotent and request.attempts < 2:
                request.exclude.add((replica.idx, generation))
                self._submit(request)
                return
            if request.exclude:  # sent again after a replica died under it, and that one died too
                error = SupervisionError(
                    f"{error}\n(service {self.name!r}: two replicas died under this request, the one it went to and "
                    "the one it was sent to again: the request itself may kill them (a crash, the memory it "
                    "takes); it is not sent a third time)", error.failures)
        self._give_up(request, error)

    def _stopped_under(self, replica: Replica, error: SupervisionError) -> ServiceStopped:
        """What a call's caller gets when shutdown() stopped ``replica`` under it (the
        supervision ``error`` it failed with as the cause): ``ServiceStopped``, as for a
        request still waiting, routed or fanned out alike."""
        stopped = ServiceStopped(f"service {self.name!r} was shut down while the call ran on replica {replica.idx}")
        stopped.__cause__ = error
        return stopped

    def _give_up(self, request: "Request | tuple[Any, Future]", error: BaseException) -> None:
        if isinstance(request, Request):
            if request.counted:
                self._count_failed(request.count)
            request.deliver(None, error)
        else:  # a request still in the batcher: (item, future)
            self._count_failed()
            request[1]._resolve(None, error)

    def _count_failed(self, requests: int = 1) -> None:
        """``requests`` callers got an error (``get_metrics().failed``)."""
        with self._lock:
            self._failed += requests

    def _fanout(self, endpoint: str, args: tuple, kwargs: dict) -> Future:
        kwargs.pop(SESSION_KWARG, None)
        future: Future = Future(runtime(), f"{self.name}.{endpoint}.fanout")

        def run() -> None:
            try:
                with self._lock:
                    self._check_running()
                    targets = self._healthy()
                    if not targets:
                        raise NoHealthyReplica(f"service {self.name!r}: no healthy replica for fanout of {endpoint!r}")
                    self._tell_recovering(endpoint, args, kwargs)
            except ServiceError as e:
                future._resolve(None, e)
                return
            self._fan_to(future, endpoint, targets, args, kwargs)

        with self._lock:
            self._check_running()
            if not self._fanout_can_run():
                self._fanouts.append(run)
                return future
            if not any(r.state is ReplicaState.HEALTHY for r in self.replicas):
                raise NoHealthyReplica(f"service {self.name!r}: every replica is out, past its restart budget (each is "
                                       "tried again once restart_window_s frees a restart); see get_metrics()")
        run()
        return future

    def _tell_recovering(self, endpoint: str, args: tuple, kwargs: dict) -> None:
        """A fanout the replicas being replaced miss: each is sent it before it serves
        (``ReplicaLifecycle._serve_when_caught_up``). The caller holds the lock."""
        for replica in self.replicas:
            if replica.state is ReplicaState.RECOVERING:
                replica.missed.append((endpoint, args, kwargs))

    def _fanout_can_run(self) -> bool:
        """Whether a fanout goes now: no replica is starting for the first time, and one
        is healthy or none can become so (then it fails). The caller holds the lock."""
        states = [r.state for r in self.replicas]
        if ReplicaState.INITIALIZING in states:
            return False
        return ReplicaState.HEALTHY in states or ReplicaState.RECOVERING not in states

    def _fan_to(self, future: Future, endpoint: str, targets: list[Replica], args: tuple, kwargs: dict) -> None:
        config = self._configs[endpoint]
        fan_in = FanIn(future, len(targets), unwrap_batch=config.batching, on_error=self._count_failed)
        args = self._fanout_args(endpoint, args, kwargs)
        requests = [Request(endpoint, args, kwargs, config, fan_in.deliver_for(replica.idx),
                            attempts=2, counted=False)  # never retried: each replica's part is its own
                    for replica in targets]
        with self._lock:  # the loop in a method of its own: see monarch_nb.wire.interrupts
            generations = self._count_sent(targets)
        if not all(len(replica.actors) == 1 for replica in targets):
            for request, replica in zip(requests, targets):
                self._send(request, replica)
            return
        started = time.perf_counter()
        try:  # one-proc replicas: one send for all (pickled once, replies on one gather)
            calls = call_one_each([replica.endpoint(endpoint) for replica in targets], args, kwargs)
        except Exception as e:  # noqa: BLE001 - as _send: an armed failure, an argument that can't be pickled
            for request, replica, generation in zip(requests, targets, generations):
                self._finished(request, replica, generation, started, None, e)
            return
        for request, replica, generation, call in zip(requests, targets, generations, calls):
            self._on_reply(request, replica, generation, started, call)

    def _fanout_args(self, endpoint: str, args: tuple, kwargs: dict) -> tuple:
        """The positional arguments a fanout sends each replica: a batching endpoint's
        one request as a batch of one."""
        return ([args[0]],) if self._configs[endpoint].batching and len(args) == 1 and not kwargs else args

    @staticmethod
    def _count_sent(targets: list[Replica]) -> list[int]:
        """Count one request sent to each of ``targets``; their generations (the caller
        holds the lock)."""
        for replica in targets:
            replica.stats.in_flight += 1
            replica.stats.requests += 1
        return [replica.generation for replica in targets]

    # -- waiting requests ----------------------------------------------------------------
    def _release_waiting(self) -> None:
        """Replica states changed: send the requests that waited for a healthy replica
        (or fail them if none can come), and the fanouts that waited for first starts."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
            fanouts: list[Callable[[], None]] = []
            if self._fanout_can_run():
                fanouts, self._fanouts = self._fanouts, []
        for request in waiting:
            self._submit(request)
        for run in fanouts:
            run()
