"""Services against plain actor calls, same run (issue 26's targets).

    .venv/bin/python bench/bench_service.py [--calls 2000] [--rounds 5]

Measures, on the ephemeral cluster of one host:

  route vs call_one    one call at a time through ``svc.ping.route()`` against
                       ``ping.call_one()`` on the same actor (a one-replica service, so
                       both reach the same actor); rounds interleaved, median per call
  fanout vs call       ``svc.ping.fanout()`` over 4 replicas against ``ping.call()`` over
                       an actor mesh of 4 procs, and against 4 ``call_one`` to the
                       replicas' own actors (the same 4 actors) gathered by hand; and
                       fanout sending one ``call_one`` per replica (how it sent before
                       ``call_one_each``: pickled and gathered once per replica)
  SIGKILL under load   3 callers route back to back to 4 replicas; one replica's proc is
                       SIGKILLed: failed requests (target 0), when the service saw it, and
                       when the replica served again (target <= 5 s after its procs are up)
  batching             requests/s of 256 concurrent ``route()`` calls to an endpoint
                       batched 16 at a time, against the same work unbatched (target >= 3x)

Prints the figures and the ratios. Runs in an isolated MONARCH_NB_HOME; exit status 1
if a process is left behind.
"""

from __future__ import annotations

from tidy import isolated_home, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import monarch_nb  # noqa: E402
from monarch_nb.actor import Actor, endpoint  # noqa: E402
from monarch_nb.client.call_each import call_one_each  # noqa: E402
from monarch_nb.service import ReplicaState, service_endpoint  # noqa: E402
from monarch_nb.service import service as service_module  # noqa: E402

BATCH = 16
IN_FLIGHT = 256


class Pinger(Actor):
    @endpoint
    def ping(self, x=None):
        return x

    @endpoint
    def work(self, x: int) -> int:
        return x + 1

    @service_endpoint(batch_size=BATCH, batch_timeout=0.005)
    def work_batched(self, xs: list) -> list:
        return [x + 1 for x in xs]


def per_call(fn, calls: int) -> float:
    """Seconds per call of ``fn()`` (which waits for its reply), over ``calls`` calls."""
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls


def route_vs_call_one(host, calls: int, rounds: int) -> tuple[float, float]:
    svc = Pinger.options(num_replicas=1, hosts=host, name="one").as_service().wait_ready(60)
    actor = svc.replicas[0].actors
    try:
        per_call(lambda: svc.ping.route(1).get(), 200)  # warm both paths
        per_call(lambda: actor.ping.call_one(1).get(), 200)
        routes, ones = [], []
        for _ in range(rounds):
            ones.append(per_call(lambda: actor.ping.call_one(1).get(), calls))
            routes.append(per_call(lambda: svc.ping.route(1).get(), calls))
        return statistics.median(routes), statistics.median(ones)
    finally:
        svc.shutdown()


def one_call_each(endpoints, args, kwargs):
    """How fanout sent before ``client.call_each``: one ``call_one`` per replica."""
    return [e.call_one(*args, **kwargs) for e in endpoints]


def timed(fn, calls: int) -> tuple[float, float]:
    """Seconds per call of ``fn()``: wall clock, and CPU time of this client process (all
    its threads: what the client spends, less sensitive to other load on the machine)."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls


def fanout_vs_call(host, calls: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Medians of (wall, client CPU) seconds per call: ``fanout``, ``before`` (fanout by
    one call_one per replica), ``call`` (over a 4-actor mesh), ``hand`` (4 call_one)."""
    svc = Pinger.options(num_replicas=4, hosts=host, name="four").as_service().wait_ready(60)
    procs = host.spawn_procs(per_host={"procs": 4}, name="mesh4")
    try:
        mesh = procs.spawn("pingers", Pinger)
        meshes = [r.actors for r in svc.replicas]

        def by_hand():
            for f in [m.ping.call_one(1) for m in meshes]:
                f.get()

        def fanout_before(n: int) -> tuple[float, float]:
            service_module.call_one_each = one_call_each
            try:
                return timed(lambda: svc.ping.fanout(1).get(), n)
            finally:
                service_module.call_one_each = call_one_each

        ways = {"fanout": lambda n: timed(lambda: svc.ping.fanout(1).get(), n), "before": fanout_before,
                "call": lambda n: timed(lambda: mesh.ping.call(1).get(), n), "hand": lambda n: timed(by_hand, n)}
        for way in ways.values():
            way(100)
        found: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
        n = max(1, calls // 4)
        for i in range(rounds):
            for name in (list(ways) if i % 2 else list(reversed(ways))):  # neither goes first every round
                found[name].append(ways[name](n))
        return {name: (statistics.median(w for w, _ in got), statistics.median(c for _, c in got))
                for name, got in found.items()}
    finally:
        svc.shutdown()
        procs.stop()


def sigkill_under_load(host) -> dict:
    svc = Pinger.options(num_replicas=4, hosts=host, name="load").as_service().wait_ready(60)
    stop, errors, served = threading.Event(), [], [0]

    def caller():
        while not stop.is_set():
            try:
                svc.ping.route(1).get(timeout=60)
                served[0] += 1
            except Exception as e:  # noqa: BLE001 - counted
                errors.append(e)

    callers = [threading.Thread(target=caller, daemon=True) for _ in range(3)]
    try:
        for c in callers:
            c.start()
        while served[0] < 1000:
            time.sleep(0.01)
        replica = svc.replicas[1]
        old = replica.procs
        killed = time.perf_counter()
        os.kill(old.pids[0], signal.SIGKILL)
        while replica.state is ReplicaState.HEALTHY and replica.procs is old:
            time.sleep(0.0005)
        seen = time.perf_counter()
        while replica.procs is old:  # the replica takes its new procs once its actor is up on them
            time.sleep(0.0005)
        procs_up = time.perf_counter()
        while replica.state is not ReplicaState.HEALTHY:
            time.sleep(0.0005)
        healthy = time.perf_counter()
        before = served[0]
        while served[0] < before + 1000:
            time.sleep(0.01)
    finally:
        stop.set()
        for c in callers:
            c.join(60)
        metrics = svc.get_metrics()
        svc.shutdown()
    return {"served": served[0], "failed": len(errors), "retried": metrics.retried, "seen_s": seen - killed,
            "procs_up_s": procs_up - killed, "healthy_after_procs_s": healthy - procs_up, "healthy_s": healthy - killed}


def throughput(route, requests: int) -> float:
    """Requests per second with ``IN_FLIGHT`` outstanding at a time."""
    started = time.perf_counter()
    done = 0
    while done < requests:
        futures = [route(i) for i in range(min(IN_FLIGHT, requests - done))]
        for f in futures:
            f.get(timeout=60)
        done += len(futures)
    return requests / (time.perf_counter() - started)


def batching(host, requests: int, rounds: int) -> tuple[float, float]:
    svc = Pinger.options(num_replicas=1, hosts=host, name="batch").as_service().wait_ready(60)
    try:
        throughput(svc.work_batched.route, 1024)
        throughput(svc.work.route, 1024)
        batched, plain = [], []
        for _ in range(rounds):
            plain.append(throughput(svc.work.route, requests))
            batched.append(throughput(svc.work_batched.route, requests))
        return statistics.median(batched), statistics.median(plain)
    finally:
        svc.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000, help="sequential calls per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cluster = monarch_nb.Cluster.start_ephemeral()
    try:
        host = cluster.this_host()
        route, one = route_vs_call_one(host, args.calls, args.rounds)
        fan = fanout_vs_call(host, args.calls, args.rounds)
        kill = sigkill_under_load(host)
        batched, plain = batching(host, 4096, args.rounds)
    finally:
        left = stop_and_check(cluster, _OWN_HOME)
    print(f"{os.cpu_count()} cores; medians of {args.rounds} interleaved rounds")
    print(f"  route            {route * 1e6:8.0f} us/call   call_one (same actor) {one * 1e6:8.0f} us/call   "
          f"ratio {route / one:.2f}x (target <= 1.2x)")
    (fanout, fanout_cpu), (call, call_cpu) = fan["fanout"], fan["call"]
    (before, before_cpu), (hand, _) = fan["before"], fan["hand"]
    print(f"  fanout over 4    {fanout * 1e6:8.0f} us/call   call over a 4-actor mesh {call * 1e6:5.0f} us/call   "
          f"ratio {fanout / call:.2f}x (target <= 1.2x)")
    print(f"                   client CPU {fanout_cpu * 1e6:5.0f} us/call   call over the mesh {call_cpu * 1e6:5.0f} us/call"
          f"   ratio {fanout_cpu / call_cpu:.2f}x")
    print(f"    before (one call_one per replica) {before * 1e6:5.0f} us/call   ratio {before / call:.2f}x; "
          f"client CPU {before_cpu * 1e6:5.0f} us/call   ratio {before_cpu / call_cpu:.2f}x")
    print(f"    4 call_one to the same 4 actors   {hand * 1e6:5.0f} us/call   fanout/that {fanout / hand:.2f}x")
    print(f"  SIGKILL of 1 of 4 replicas under 3 callers: {kill['failed']} failed of {kill['served']} "
          f"({kill['retried']} retried); seen {kill['seen_s'] * 1e3:.1f} ms after the kill, new procs and actor up at "
          f"{kill['procs_up_s'] * 1e3:.0f} ms, serving {kill['healthy_after_procs_s'] * 1e3:.1f} ms after that "
          f"(target <= 5 s)")
    print(f"  batch {BATCH:<3}        {batched:8.0f} req/s   unbatched {plain:8.0f} req/s   "
          f"ratio {batched / plain:.1f}x (target >= 3x)")
    return left


if __name__ == "__main__":
    sys.exit(main())
