"""Services: replicated actor meshes behind route()/fanout(), sessions, recovery of a
killed replica under load, batching, shutdown. The first tests are pure logic (no
processes); the rest run real replicas on the module's ephemeral cluster."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import warnings

import pytest

from monarch_nb.actor import Actor, endpoint
from monarch_nb.errors import ActorError, SupervisionError
from monarch_nb.service import (LeastLoadedRouter, NoHealthyReplica, ReplicaState, RoundRobinRouter, Router,
                                ServiceError, ServiceOptions, ServiceStopped, SessionMoved, SessionRouter,
                                UnknownSession, service_endpoint)
from monarch_nb.service.batcher import Batcher
from monarch_nb.service.lifecycle import RETRY_S
from monarch_nb.service.replica import percentile
from monarch_nb.service.routers import make_router
from conftest import pids_alive, wait_until

BOUND_S = 60


# -- pure logic -------------------------------------------------------------------------------
class _R:
    def __init__(self, idx: int, load: int = 0):
        self.idx, self.load = idx, load


def test_round_robin_spreads_calls_evenly_over_the_healthy_replicas():
    router, healthy = RoundRobinRouter(), [_R(i) for i in range(4)]
    picks = [router.get_replica(healthy).idx for _ in range(400)]
    assert {i: picks.count(i) for i in range(4)} == {0: 100, 1: 100, 2: 100, 3: 100}
    assert {router.get_replica(healthy[1:3]).idx for _ in range(10)} == {1, 2}  # only those given


def test_least_loaded_picks_the_replica_with_fewest_calls_outstanding_and_spreads_ties():
    router = LeastLoadedRouter()
    assert {router.get_replica([_R(0, 5), _R(1, 2), _R(2, 9)]).idx for _ in range(20)} == {1}
    assert {router.get_replica([_R(0), _R(1), _R(2)]).idx for _ in range(30)} == {0, 1, 2}


def test_session_router_keeps_a_session_on_its_replica_and_records_a_move_when_it_is_gone():
    router, session_map = SessionRouter(fallback=RoundRobinRouter()), {}
    healthy = [_R(i) for i in range(3)]
    first = router.get_replica(healthy, "s", session_map).idx
    assert {router.get_replica(healthy, "s", session_map).idx for _ in range(20)} == {first}
    assert router.moved == []
    rest = [r for r in healthy if r.idx != first]
    now = router.get_replica(rest, "s", session_map).idx
    assert now != first and session_map["s"] == now and router.moved == [("s", first, now)]
    with pytest.raises(ValueError, match="sess_id"):
        router.get_replica(healthy)


def test_a_users_router_is_made_once_per_service_and_bad_routers_are_refused():
    class Last(Router):
        def get_replica(self, healthy, sess_id=None, session_map=None):
            return healthy[-1]

    assert isinstance(make_router(Last), Last) and make_router(None).__class__ is RoundRobinRouter
    mine = Last()
    assert make_router(mine) is mine
    with pytest.raises(TypeError, match="not a Router"):
        make_router(object)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Router subclass"):
        service_endpoint(router=lambda healthy: healthy[0])  # type: ignore[arg-type]


def test_service_endpoint_refuses_batch_size_0_and_a_timeout_of_0():
    with pytest.raises(ValueError, match="batch_size=0"):
        service_endpoint(batch_size=0)
    with pytest.raises(ValueError, match="batch_timeout=0"):
        service_endpoint(batch_size=4, batch_timeout=0)


def test_batcher_sends_a_full_batch_at_once_and_a_partial_one_at_its_timeout():
    sent: list[tuple[object, list]] = []
    batcher = Batcher(lambda key, items: sent.append((key, list(items))))
    try:
        for i in range(4):
            batcher.add("k", i, size=4, timeout=60)
        assert sent == [("k", [0, 1, 2, 3])]  # full: sent by the thread that filled it
        batcher.add("k", 4, size=4, timeout=0.05)
        batcher.add("other", 5, size=4, timeout=0.05)  # other keys never mix in
        assert wait_until(lambda: len(sent) == 3, 10)
        assert sorted(sent[1:]) == [("k", [4]), ("other", [5])]
        batcher.add("k", 6, size=4, timeout=60)
    finally:
        assert batcher.close() == [6]  # what was never sent goes back to fail
    with pytest.raises(RuntimeError, match="closed"):
        batcher.add("k", 7, size=4, timeout=1)


def test_a_restart_budget_allows_max_restarts_within_any_window_and_more_as_they_leave_it():
    from monarch_nb.service.restarts import RestartBudget

    budget = RestartBudget(2, window_s=10.0)
    for now in (0.0, 1.0):
        assert budget.allows(now)
        budget.spend(now)
    assert not budget.allows(9.9)  # 2 within the last 10 s
    assert budget.allows(10.0)  # the first has left the window
    budget.spend(10.0)
    assert not budget.allows(10.5) and budget.allows(11.0)
    whole_life = RestartBudget(1, window_s=None)
    whole_life.spend(0.0)
    assert not whole_life.allows(1e9)
    assert not RestartBudget(0, window_s=10.0).allows(0.0)


def test_replica_mesh_names_keep_one_length_however_many_times_a_replica_is_replaced():
    from monarch_nb.service.restarts import longest_mesh_name, replica_mesh_name

    key = "svc-abc123"
    names = {replica_mesh_name(key, 3, generation) for generation in range(1, 10**7, 9973)}
    assert {len(name) for name in names} == {len(f"{key}-r3g0")}
    assert replica_mesh_name(key, 0, 11) == replica_mesh_name(key, 0, 1) != replica_mesh_name(key, 0, 2)
    assert longest_mesh_name(key, 12) == f"{key}-r11g9"


def test_percentiles_are_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile([], 50)) == (50.0, 99.0, 0.0)


# -- actors served -------------------------------------------------------------------------------
class Worker(Actor):
    def __init__(self, tag: str = ""):
        self.tag = tag
        self.loaded = 0

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def echo(self, x):
        return (os.getpid(), self.tag, x)

    @endpoint
    def load(self, version: int) -> None:
        self.loaded = version

    @endpoint
    def version(self) -> int:
        return self.loaded

    @endpoint
    def crash(self) -> None:
        os._exit(3)  # the proc dies under the call: a supervision failure, not an exception

    @service_endpoint(idempotent=False)
    def charge(self, seconds: float) -> int:
        time.sleep(seconds)
        return os.getpid()

    @endpoint
    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return os.getpid()

    @service_endpoint(batch_size=4, batch_timeout=0.2)
    def drop_last(self, xs: list) -> list:
        return xs[:-1]  # one result short: not one per request

    @service_endpoint(batch_size=8, batch_timeout=0.2)
    def square(self, xs: list) -> list:
        if any(x == "boom" for x in xs):
            raise ValueError("boom in this batch")
        return [(x * x, len(xs)) for x in xs]


@pytest.fixture
def services(host):
    made = []

    def make(num_replicas: int = 4, *args, **options):
        svc = Worker.options(procs=1, num_replicas=num_replicas, hosts=host, **options).as_service(*args)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        pids = [p for r in svc.replicas for p in (r.procs.pids if r.procs is not None else [])]
        svc.shutdown()
        assert wait_until(lambda: not pids_alive(pids), 10), f"replica procs left: {pids_alive(pids)}"


def test_as_service_returns_at_once_and_calls_made_before_the_replicas_are_up_are_served(services):
    started = time.monotonic()
    svc = services(2, "early")
    returned_s = time.monotonic() - started
    future = svc.echo.route(1)  # no replica is healthy yet: it waits in the service
    assert future.get(timeout=BOUND_S)[1:] == ("early", 1)
    assert returned_s < 2.0, f"as_service took {returned_s:.2f} s to return"
    assert svc.wait_ready(BOUND_S) is svc
    assert [r.state for r in svc.replicas] == [ReplicaState.HEALTHY] * 2


def test_route_round_robin_reaches_every_replica(services):
    svc = services(4).wait_ready(BOUND_S)
    pids = [svc.pid.route().get(timeout=BOUND_S) for _ in range(40)]
    replica_pids = {r.procs.pids[0] for r in svc.replicas}
    assert set(pids) == replica_pids and len(replica_pids) == 4
    assert sorted(pids.count(p) for p in replica_pids) == [10, 10, 10, 10]
    metrics = svc.get_metrics()
    assert [r["requests"] for r in metrics.replicas] == [10, 10, 10, 10]
    assert all(r["state"] == "healthy" and r["in_flight"] == 0 and r["latency_p99_s"] > 0 for r in metrics.replicas)


def test_fanout_returns_one_result_per_replica_in_replica_order(services):
    svc = services(4, "fan").wait_ready(BOUND_S)
    results = svc.echo.fanout("x").get(timeout=BOUND_S)
    assert [pid for pid, _, _ in results] == [r.procs.pids[0] for r in svc.replicas]
    assert {(tag, x) for _, tag, x in results} == {("fan", "x")}


def test_awaiting_a_service_waits_for_its_replicas_and_async_sessions_pin(services):
    svc = services(3)

    async def use():
        ready = await svc
        async with ready.session():
            pids = {await ready.pid.route() for _ in range(6)}
        return ready, pids

    ready, pids = asyncio.run(use())
    assert ready is svc and len(pids) == 1
    assert all(r.state is ReplicaState.HEALTHY for r in svc.replicas)


def test_a_session_pins_its_calls_to_one_replica_and_sessions_spread(services):
    svc = services(4).wait_ready(BOUND_S)
    with svc.session() as session:
        pinned = {svc.pid.route().get(timeout=BOUND_S) for _ in range(12)}
        assert svc.session_replica(session.session_id) is not None
    assert len(pinned) == 1
    sid = svc.start_session()
    explicit = {svc.pid.route(sess_id=sid).get(timeout=BOUND_S) for _ in range(8)}
    assert len(explicit) == 1
    svc.terminate_session(sid)
    with pytest.raises(UnknownSession, match="no session"):
        svc.pid.route(sess_id=sid)
    with pytest.raises(UnknownSession):
        svc.terminate_session("no-such-session")
    sessions = [svc.start_session() for _ in range(4)]  # new sessions go to the least loaded
    assert len({svc.pid.route(sess_id=s).get(timeout=BOUND_S) for s in sessions}) >= 2


def _steady_load(svc, threads: int = 3):
    """Callers routing to ``svc`` back to back; returns (stop, counts, errors)."""
    stop, counts, errors = threading.Event(), [0] * threads, []

    def caller(i: int):
        while not stop.is_set():
            try:
                svc.echo.route(i).get(timeout=BOUND_S)
                counts[i] += 1
            except Exception as e:  # noqa: BLE001 - what the test counts
                errors.append(e)

    workers = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()

    def finish():
        stop.set()
        for w in workers:
            w.join(BOUND_S)
        return counts, errors

    return finish, counts


def test_sigkill_of_a_replica_under_steady_load_fails_no_request_and_the_replica_comes_back(services):
    loaded = []
    svc = services(3, "load", on_replica_start=lambda replica: loaded.append(replica.idx)).wait_ready(BOUND_S)
    assert sorted(loaded) == [0, 1, 2]  # the hook ran at each start
    sid = svc.start_session()
    while svc.session_replica(sid) != 1:  # a session on the replica that will be killed
        svc.terminate_session(sid)
        sid = svc.start_session()
        svc.pid.route(sess_id=sid).get(timeout=BOUND_S)
    finish, counts = _steady_load(svc)
    assert wait_until(lambda: sum(counts) > 300, BOUND_S)
    victim = svc.replicas[1].procs.pids[0]
    os.kill(victim, signal.SIGKILL)
    assert wait_until(lambda: svc.replicas[1].state is not ReplicaState.HEALTHY or svc.replicas[1].restarts, BOUND_S)
    assert wait_until(lambda: svc.replicas[1].state is ReplicaState.HEALTHY, BOUND_S)
    before = sum(counts)
    assert wait_until(lambda: sum(counts) > before + 300, BOUND_S)  # still serving after
    done, errors = finish()
    assert errors == []
    replica = svc.replicas[1]
    assert replica.restarts == 1 and len(replica.recoveries_s) == 1 and victim not in replica.procs.pids
    assert "SIGKILL" in replica.last_failure
    assert loaded.count(1) == 2  # and again for the replacement
    assert svc.get_metrics().failed == 0
    with warnings.catch_warnings(record=True) as caught:  # the session moved, and says so
        warnings.simplefilter("always")
        svc.pid.route(sess_id=sid).get(timeout=BOUND_S)
    assert [w.category for w in caught] == [SessionMoved]
    assert "moved from replica 1" in str(caught[0].message)


def test_a_non_idempotent_call_in_flight_on_a_killed_replica_raises_instead_of_running_again(services):
    svc = services(2).wait_ready(BOUND_S)
    sid = svc.start_session()
    svc.pid.route(sess_id=sid).get(timeout=BOUND_S)
    replica = svc.replicas[svc.session_replica(sid)]
    future = svc.charge.route(30, sess_id=sid)
    assert wait_until(lambda: replica.stats.in_flight == 1, BOUND_S)
    os.kill(replica.procs.pids[0], signal.SIGKILL)
    with pytest.raises(SupervisionError, match="SIGKILL"):
        future.get(timeout=BOUND_S)
    assert svc.get_metrics().retried == 0
    assert svc.echo.route(1).get(timeout=BOUND_S)[2] == 1  # the other replica serves meanwhile


def test_calls_made_while_the_only_replica_is_replaced_wait_for_it(services):
    svc = services(1).wait_ready(BOUND_S)
    old = svc.replicas[0].procs.pids[0]
    os.kill(old, signal.SIGKILL)
    assert wait_until(lambda: svc.replicas[0].state is not ReplicaState.HEALTHY, BOUND_S)
    routed, fanned = svc.pid.route(), svc.pid.fanout()  # nothing healthy: they wait in the service
    new = routed.get(timeout=BOUND_S)
    assert new != old and fanned.get(timeout=BOUND_S) == [new]
    assert svc.get_metrics().failed == 0


def test_a_call_whose_replica_dies_is_retried_exactly_once(services):
    svc = services(3).wait_ready(BOUND_S)
    pids = [r.procs.pids[0] for r in svc.replicas]
    with pytest.raises(SupervisionError, match="two replicas died under this request"):
        svc.crash.route().get(timeout=BOUND_S)  # kills its replica, then the one it was retried on
    assert wait_until(lambda: len(pids_alive(pids)) == 1, BOUND_S)  # the third was never called
    metrics = svc.get_metrics()
    assert (metrics.retried, metrics.failed) == (1, 1)
    assert svc.wait_healthy(BOUND_S)  # both replaced
    assert sorted(r.restarts for r in svc.replicas) == [0, 1, 1]


def test_a_fanout_whose_caller_gets_an_error_counts_as_one_failed_request(services):
    # Each replica's part counted: a fanout to 2 replicas that both died showed failed 2,
    # and one whose dying replica was just left out of the list counted 1 with no error.
    svc = services(2).wait_ready(BOUND_S)
    with pytest.raises(SupervisionError):
        svc.crash.fanout().get(timeout=BOUND_S)  # both replicas die under it
    assert svc.get_metrics().failed == 1
    assert svc.wait_healthy(BOUND_S)


def test_past_max_restarts_a_replica_stays_out_and_the_others_serve(services):
    svc = services(2, max_restarts=0).wait_ready(BOUND_S)
    os.kill(svc.replicas[0].procs.pids[0], signal.SIGKILL)
    assert wait_until(lambda: svc.replicas[0].state is ReplicaState.UNHEALTHY, BOUND_S)
    survivor = svc.replicas[1].procs.pids[0]
    assert {svc.pid.route().get(timeout=BOUND_S) for _ in range(6)} == {survivor}
    assert svc.pid.fanout().get(timeout=BOUND_S) == [survivor]
    os.kill(survivor, signal.SIGKILL)
    assert wait_until(lambda: svc.replicas[1].state is ReplicaState.UNHEALTHY, BOUND_S)
    with pytest.raises(NoHealthyReplica, match="replica 0 unhealthy"):
        svc.pid.route()


class Broken(Actor):
    def __init__(self):
        raise RuntimeError("no weights file")

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def test_a_replica_that_cannot_start_is_retried_within_the_bound_then_reported(host):
    started = time.monotonic()
    svc = Broken.options(num_replicas=2, hosts=host, max_restarts=2).as_service()
    try:
        with pytest.raises(NoHealthyReplica, match="no weights file"):
            svc.wait_ready(BOUND_S)
        # Not every restart at once (12 failed starts took 0.3 s): after RETRY_S, then twice that.
        assert time.monotonic() - started >= RETRY_S * 3
        assert [(r.state, r.restarts) for r in svc.replicas] == [(ReplicaState.UNHEALTHY, 2)] * 2
        with pytest.raises(NoHealthyReplica):
            svc.pid.route()
    finally:
        svc.shutdown()


def test_a_replica_whose_proc_stops_answering_is_replaced_and_its_routes_are_served_elsewhere(host):
    # A SIGSTOPped replica stayed healthy: a third of the routes went to it and waited
    # for ever, and fanout() never returned (health() said unresponsive meanwhile).
    svc = Worker.options(num_replicas=3, hosts=host, health_check_period_s=0.5,
                         health_check_timeout_s=2.0).as_service().wait_ready(BOUND_S)
    frozen = svc.replicas[1].procs.pids[0]
    os.kill(frozen, signal.SIGSTOP)
    try:
        routes = [svc.pid.route() for _ in range(9)]
        served = {f.get(timeout=BOUND_S) for f in routes}
        assert frozen not in served and len(served) >= 2
        assert wait_until(lambda: svc.replicas[1].state is ReplicaState.HEALTHY and svc.replicas[1].restarts >= 1,
                          BOUND_S)
        assert "did not answer a health check within 2 s" in svc.replicas[1].last_failure
        assert svc.wait_healthy(BOUND_S)
        assert len(svc.pid.fanout().get(timeout=BOUND_S)) == 3  # it returns (it never did)
        assert wait_until(lambda: not pids_alive([frozen]), BOUND_S)  # not left behind, stopped
    finally:
        if pids_alive([frozen]):
            os.kill(frozen, signal.SIGCONT)
        pids = [p for r in svc.replicas for p in (r.procs.pids if r.procs is not None else [])]
        svc.shutdown()
        assert wait_until(lambda: not pids_alive(pids), 10)


def test_shutdown_called_from_on_replica_start_stops_the_service(host):
    # It raised "cannot join current thread" and left the service half stopped.
    raised = []

    def hook(replica):
        if replica.restarts:  # its first replacement
            try:
                svc.shutdown(timeout=BOUND_S)
            except Exception as e:  # noqa: BLE001 - what the test looks for
                raised.append(e)

    svc = Worker.options(hosts=host, on_replica_start=hook).as_service().wait_ready(BOUND_S)
    first = svc.replicas[0].procs.pids
    os.kill(first[0], signal.SIGKILL)
    assert wait_until(lambda: svc.replicas[0].state is ReplicaState.STOPPED, BOUND_S), svc.replicas[0].state
    assert not raised
    replaced = svc.replicas[0].procs.pids
    assert wait_until(lambda: not pids_alive(first + replaced), 10)
    with pytest.raises(ServiceStopped):
        svc.pid.route()


def test_health_check_options_are_checked_at_once(host):
    for option, value in (("health_check_period_s", 0), ("health_check_period_s", "10"),
                          ("health_check_timeout_s", None), ("health_check_timeout_s", -1)):
        with pytest.raises(ValueError, match=f"{option}=.*give seconds > 0"):
            Worker.options(hosts=host, **{option: value}).as_service()


def test_a_service_name_its_replicas_meshes_could_not_take_is_refused_at_once(cluster, host):
    # A 52-character name served until its 10th restart, whose mesh name was 65 long.
    meshes = set(cluster.info()["proc_meshes"])
    for name, options in (("a/b", {}), ("has space", {}), ("é", {}), ("x" * 53, {})):
        with pytest.raises(ValueError, match="names its replicas' meshes.*give 1-"):
            Worker.options(hosts=host, name=name, **options).as_service()
    assert set(cluster.info()["proc_meshes"]) == meshes  # nothing was started


def test_a_service_name_fits_its_meshes_however_many_restarts_are_allowed(services):
    # The generation in a mesh name grew with each restart: a 52-character name was
    # refused with max_restarts=99 (its 100th restart's name, 65 long, was too long for
    # a mesh), and no bound on a service's restarts over its life could be allowed.
    svc = services(1, name="x" * 52, max_restarts=99).wait_ready(BOUND_S)
    assert svc.pid.route().get(timeout=BOUND_S) == svc.replicas[0].procs.pids[0]


def test_the_restart_window_is_checked_at_once(host):
    for value in (0, -1, "600", True):
        with pytest.raises(ValueError, match=r"restart_window_s=.*give seconds > 0 \(or None: max_restarts counts"):
            Worker.options(hosts=host, restart_window_s=value).as_service()


def test_a_replica_is_replaced_again_once_its_earlier_restarts_leave_the_window(services):
    # max_restarts counted over the service's life: a generator that ran for days and
    # lost a replica now and then (an OOM on one long sequence) ended with none.
    svc = services(2, max_restarts=1, restart_window_s=1.0).wait_ready(BOUND_S)
    replica = svc.replicas[0]
    for restarts in (1, 2):
        assert wait_until(lambda: _budget_allows(svc, replica), BOUND_S)  # the restart before has left the window
        killed = replica.procs.pids[0]
        os.kill(killed, signal.SIGKILL)
        assert wait_until(lambda: replica.restarts == restarts and replica.state is ReplicaState.HEALTHY,
                          BOUND_S), svc.get_metrics()
        assert killed not in replica.procs.pids
    assert set(svc.pid.fanout().get(timeout=BOUND_S)) == {r.procs.pids[0] for r in svc.replicas}


def test_a_replica_out_past_its_budget_is_tried_again_once_its_window_frees_a_restart(services):
    # Left UNHEALTHY for good, a burst of failures (3 OOMs within 10 minutes on long
    # sequences) cost an RL generator that replica for the rest of a days-long run.
    window_s = 15.0
    svc = services(2, max_restarts=1, restart_window_s=window_s).wait_ready(BOUND_S)
    replica = svc.replicas[0]
    os.kill(replica.procs.pids[0], signal.SIGKILL)
    assert wait_until(lambda: replica.restarts == 1 and replica.state is ReplicaState.HEALTHY, BOUND_S)
    assert not _budget_allows(svc, replica)  # its one restart of the window is spent
    killed = replica.procs.pids[0]
    os.kill(killed, signal.SIGKILL)
    assert wait_until(lambda: replica.state is ReplicaState.UNHEALTHY, BOUND_S)
    assert not pids_alive([killed])
    survivor = svc.replicas[1].procs.pids[0]
    assert {svc.pid.route().get(timeout=BOUND_S) for _ in range(4)} == {survivor}  # the other serves meanwhile
    assert wait_until(lambda: replica.state is ReplicaState.HEALTHY, window_s + BOUND_S), svc.get_metrics()
    assert replica.restarts == 2 and killed not in replica.procs.pids
    assert set(svc.pid.fanout().get(timeout=BOUND_S)) == {r.procs.pids[0] for r in svc.replicas}


def _budget_allows(svc, replica) -> bool:
    with svc._lock:  # (the service's lock guards a budget)
        return replica.budget.allows(time.monotonic())


def test_a_replica_replaced_more_times_than_it_has_names_reuses_them_and_never_takes_a_stale_mesh(
        cluster, host, services, monkeypatch):
    # Names are reused (a bounded name, however many restarts); a mesh of the name a
    # replacement takes that is still registered (its stop failed) must not be handed
    # back as the new one: the hub returns an existing mesh of that name and extent.
    from monarch_nb.service import restarts

    monkeypatch.setattr(restarts, "GENERATION_SLOTS", 2)
    svc = services(1, max_restarts=5).wait_ready(BOUND_S)
    replica = svc.replicas[0]
    first = replica.actors.name
    stale = host.spawn_procs(per_host={"procs": 1}, name=f"{svc._key}-r0g0").pids[0]  # the next name
    seen = [first]
    for restarts_so_far in (1, 2):
        old = replica.procs.pids[0]
        os.kill(old, signal.SIGKILL)
        assert wait_until(lambda: replica.restarts == restarts_so_far and replica.state is ReplicaState.HEALTHY,
                          BOUND_S), svc.get_metrics()
        assert replica.procs.pids[0] not in (old, stale)
        seen.append(replica.actors.name)
    assert seen == [first, f"{svc._key}-r0g0", first]  # bounded: the first name again
    assert wait_until(lambda: not pids_alive([stale]), BOUND_S)  # stopped, not served from
    assert svc.pid.route().get(timeout=BOUND_S) == replica.procs.pids[0]
    assert [m for m in cluster.info()["proc_meshes"] if m.startswith(svc._key)] == [first]


def test_a_fanout_made_while_a_replacement_starts_reaches_it_before_it_serves(services):
    # The replacement's hook loaded weights 1 while a fanout sent 2 to the healthy
    # replicas only: it then served version 1 (an RL loop's generator, steps behind).
    hook_running, fanned = threading.Event(), threading.Event()

    def hook(replica):
        replica.actors.load.call(1).get(timeout=BOUND_S)  # the weights it finds as it starts
        if replica.restarts:
            hook_running.set()
            assert fanned.wait(BOUND_S)

    svc = services(2, on_replica_start=hook).wait_ready(BOUND_S)
    os.kill(svc.replicas[0].procs.pids[0], signal.SIGKILL)
    assert hook_running.wait(BOUND_S)
    assert svc.load.fanout(2).get(timeout=BOUND_S) == [None]  # the healthy replica's part
    fanned.set()
    assert wait_until(lambda: svc.replicas[0].state is ReplicaState.HEALTHY, BOUND_S)
    assert svc.version.fanout().get(timeout=BOUND_S) == [2, 2]


def test_a_failing_on_replica_start_hook_counts_as_a_failed_start(services):
    calls = []

    def hook(replica):
        calls.append(replica.idx)
        if calls.count(replica.idx) == 1 and replica.idx == 0:
            raise OSError("weights not there yet")
        replica.actors.load.call(7).get(timeout=BOUND_S)

    svc = services(2, on_replica_start=hook).wait_ready(BOUND_S)
    assert [(r.state, r.restarts) for r in svc.replicas] == [(ReplicaState.HEALTHY, 1), (ReplicaState.HEALTHY, 0)]
    assert svc.version.fanout().get(timeout=BOUND_S) == [7, 7]  # served only after the hook ran


def test_batching_gathers_concurrent_routes_into_one_call_and_sends_partial_batches(services):
    svc = services(1).wait_ready(BOUND_S)
    futures = [svc.square.route(i) for i in range(16)]
    results = [f.get(timeout=BOUND_S) for f in futures]
    assert [r[0] for r in results] == [i * i for i in range(16)]
    assert [r[1] for r in results] == [8] * 16  # two calls of 8, not 16 of 1
    partial = [svc.square.route(i) for i in range(3)]
    assert [f.get(timeout=BOUND_S) for f in partial] == [(0, 3), (1, 3), (4, 3)]  # sent at its timeout
    assert svc.get_metrics().replicas[0]["requests"] == 19
    with pytest.raises(TypeError, match="one request argument"):
        svc.square.route(1, 2)


def test_batching_on_replicas_of_several_procs_gives_each_request_a_value_mesh_of_its_results(host):
    # Every batched route to a replica of 2 procs (an RL generator split over 2 GPUs)
    # failed: "returned a ValueMesh", where the endpoint had returned a right list on each.
    svc = Worker.options(procs=2, num_replicas=1, hosts=host).as_service()
    try:
        svc.wait_ready(BOUND_S)
        results = [f.get(timeout=BOUND_S) for f in [svc.square.route(i) for i in range(3)]]
        assert [r.values() for r in results] == [[(i * i, 3)] * 2 for i in range(3)]  # one batch of 3
        assert [r.values() for r in svc.square.fanout(5).get(timeout=BOUND_S)] == [[(25, 1)] * 2]
        bad = svc.square.route("boom")
        with pytest.raises(ActorError, match="boom in this batch"):
            bad.get(timeout=BOUND_S)
    finally:
        pids = svc.replicas[0].procs.pids
        svc.shutdown()
        assert wait_until(lambda: not pids_alive(pids), 10)


def test_an_exception_in_a_batch_fails_only_that_batchs_requests(services):
    svc = services(1).wait_ready(BOUND_S)
    bad = [svc.square.route(x) for x in [1, 2, "boom", 4, 5, 6, 7, 8]]
    good = [svc.square.route(x) for x in range(8)]
    for f in bad:
        with pytest.raises(ActorError, match="boom in this batch"):
            f.get(timeout=BOUND_S)
    assert [f.get(timeout=BOUND_S)[0] for f in good] == [x * x for x in range(8)]


def test_a_batch_whose_results_are_not_one_per_request_counts_each_request_as_failed(services):
    # Its callers got the ServiceError, and get_metrics() said failed 0.
    svc = services(1).wait_ready(BOUND_S)
    futures = [svc.drop_last.route(i) for i in range(4)]  # one full batch
    for future in futures:
        with pytest.raises(ServiceError, match="got 4 requests and returned 3 results"):
            future.get(timeout=BOUND_S)
    metrics = svc.get_metrics()
    assert (metrics.failed, metrics.replicas[0]["failed"], metrics.retried) == (4, 4, 0)


def test_a_request_in_flight_at_shutdown_fails_without_counting_as_retried(services):
    # Its replica stopped under it, the service counted it retried, then failed it.
    svc = services(2).wait_ready(BOUND_S)
    future = svc.nap.route(BOUND_S)
    assert wait_until(lambda: sum(r.stats.in_flight for r in svc.replicas) == 1, BOUND_S)
    svc.shutdown()
    with pytest.raises(ServiceStopped):
        future.get(timeout=BOUND_S)
    metrics = svc.get_metrics()
    assert (metrics.retried, metrics.failed) == (0, 1)


def test_a_fanout_in_flight_at_shutdown_raises_service_stopped_as_a_route_does(services):
    # It raised SupervisionError: its replicas' procs were stopped under it.
    svc = services(2).wait_ready(BOUND_S)
    future = svc.nap.fanout(BOUND_S)
    assert wait_until(lambda: all(r.stats.in_flight == 1 for r in svc.replicas), BOUND_S)
    svc.shutdown()
    with pytest.raises(ServiceStopped, match="was shut down"):
        future.get(timeout=BOUND_S)
    assert svc.get_metrics().failed == 1


def test_metrics_list_the_pids_of_healthy_replicas_only(services):
    # A replica failed for good still listed the pid of its dead proc.
    svc = services(2, max_restarts=0).wait_ready(BOUND_S)
    dead = svc.replicas[0].procs.pids[0]
    os.kill(dead, signal.SIGKILL)
    assert wait_until(lambda: svc.replicas[0].state is ReplicaState.UNHEALTHY, BOUND_S)
    assert [r["pids"] for r in svc.get_metrics().replicas] == [[], svc.replicas[1].procs.pids]
    svc.shutdown()
    assert [r["pids"] for r in svc.get_metrics().replicas] == [[], []]


def test_a_broadcast_that_raises_says_so_on_stderr(services, capsys):
    # It was dropped without a word (a weight load given an argument it refused).
    svc = services(2).wait_ready(BOUND_S)
    svc.square.broadcast("boom")
    assert len(svc.version.fanout().get(timeout=BOUND_S)) == 2  # (its replies came in with these)
    assert wait_until(lambda: "square.broadcast(...) failed: ActorError" in capsys.readouterr().err, BOUND_S)


def test_shutdown_stops_every_replica_process_and_later_use_raises(services):
    svc = services(3).wait_ready(BOUND_S)
    pids = [r.procs.pids[0] for r in svc.replicas]
    assert len(pids_alive(pids)) == 3
    waiting = svc.square.route(1)  # still in its batch: fails with the service
    svc.shutdown()
    assert wait_until(lambda: not pids_alive(pids), 10)
    assert [r.state for r in svc.replicas] == [ReplicaState.STOPPED] * 3
    with pytest.raises(ServiceStopped):
        waiting.get(timeout=BOUND_S)
    with pytest.raises(ServiceStopped, match="shut down"):
        svc.pid.route()
    with pytest.raises(ServiceStopped):
        svc.start_session()
    with pytest.raises(ServiceStopped, match="was shut down"):  # not "no replica could start: replica 0: ; ..."
        svc.wait_ready(BOUND_S)
    svc.shutdown()  # again: nothing to do


def test_bad_options_and_unknown_endpoints_get_clear_errors(host):
    with pytest.raises(ValueError, match="num_replicas=0"):
        Worker.options(num_replicas=0, hosts=host).as_service()
    with pytest.raises(TypeError, match="unknown option"):
        Worker.options(replicas=2)
    svc = ServiceOptions(Worker, num_replicas=1, hosts=host).as_service()
    try:
        with pytest.raises(AttributeError, match="no endpoint 'nope'.*endpoints: charge, crash, drop_last, echo"):
            svc.nope
        with pytest.raises(TypeError, match=r"use \.route"):
            svc.pid.call()
    finally:
        svc.shutdown()
