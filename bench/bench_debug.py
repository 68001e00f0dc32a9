"""Debugger benchmark: how fast stops show up, how fast paused ranks answer, and what
arming debugpy costs a proc that is not paused.

    .venv/bin/python bench/bench_debug.py [--quick]

1. ``breakpoint()`` -> entry visible in the client: a ``broadcast`` to an endpoint
   whose first line is ``breakpoint()``, until the hub's ``debug_changed`` event with
   that rank reaches the client (armed proc; the first stop in a fresh proc, which
   imports and starts debugpy, is reported separately). Baseline: ``call_one``
   round trip to the same actor.
2. ``eval`` round trip: ``cluster.debugger.eval("y", mesh, ranks)`` on 1 paused rank
   and on 8 paused ranks at once (each proc's session talks to pydevd over a Unix
   socketpair: no port, and no Nagle delay).
3. Armed but not paused: an 8-proc mesh armed (a breakpoint hit and continued, no
   breakpoint left) against an 8-proc mesh never armed, same run, interleaved blocks:
   ``call_one`` round trip of a trivial endpoint, and a Python loop of 200k
   iterations inside an endpoint; then the loop again while a breakpoint is set
   elsewhere in the mesh (debugpy must trace every thread then).

Runs in an isolated MONARCH_NB_HOME; exit status 1 if a process is left behind.
"""

from __future__ import annotations

from tidy import isolated_home, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from monarch_nb.actor import Actor, current_rank, endpoint, this_host  # noqa: E402
from monarch_nb.client import cluster as cluster_mod  # noqa: E402


class Target(Actor):
    @endpoint
    def halt(self) -> int:
        breakpoint()
        y = current_rank().rank
        return y

    @endpoint
    def ping(self) -> int:
        return 0

    @endpoint
    def spin(self, n: int) -> int:
        total = 0
        for i in range(n):
            total += i & 7
        return total


def _median_ms(samples) -> float:
    return statistics.median(samples) * 1e3


def _visible(dbg, mesh, rank: int, reps: int) -> list[float]:
    """Seconds from broadcast to the stop of ``rank`` showing in the client."""
    seen = threading.Event()

    def on_change(stops):
        if any(s.mesh == mesh._name and s.rank == rank for s in stops):
            seen.set()

    unwatch = dbg.watch(on_change)
    times = []
    try:
        for _ in range(reps):
            seen.clear()
            t = time.perf_counter()
            mesh.slice(gpus=rank).halt.broadcast()
            if not seen.wait(60):
                raise RuntimeError("the stop did not show within 60 s")
            times.append(time.perf_counter() - t)
            dbg.continue_(mesh._name, rank)
    finally:
        unwatch()
    return times


def _round_trips(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    reps = 5 if args.quick else 20
    host = this_host()
    cluster = cluster_mod.default_cluster()
    dbg = cluster.debugger
    status = 1
    try:
        armed_procs = host.spawn_procs(per_host={"gpus": 8}, name="armed")
        plain_procs = host.spawn_procs(per_host={"gpus": 8}, name="plain")
        armed = armed_procs.spawn("armed", Target)
        plain = plain_procs.spawn("plain", Target)

        # 1. breakpoint() -> visible
        first = _visible(dbg, armed, 0, 1)[0]  # rank 0's proc arms here
        visible = _visible(dbg, armed, 0, reps)
        ping = _round_trips(lambda: armed.slice(gpus=0).ping.call_one().get(), reps * 5)
        print(f"breakpoint() -> entry visible in the client: median {_median_ms(visible):.1f} ms "
              f"(max {max(visible) * 1e3:.1f} ms); first stop in a fresh proc (starts debugpy) "
              f"{first * 1e3:.0f} ms; baseline call_one round trip {_median_ms(ping):.2f} ms", flush=True)

        # 2. eval round trips
        pending = armed.halt.call()
        dbg.wait_paused(8, "armed", timeout=120)
        one = _round_trips(lambda: dbg.eval("y", "armed", 3), reps * 2)
        eight = _round_trips(lambda: dbg.eval("y", "armed"), reps * 2)
        print(f"eval round trip: 1 rank {_median_ms(one):.2f} ms, 8 ranks at once {_median_ms(eight):.2f} ms "
              f"({_median_ms(eight) / _median_ms(one):.1f}x)", flush=True)
        dbg.continue_all()
        pending.get(timeout=60)

        # 3. armed but not paused vs never armed
        assert not dbg.breakpoints()
        rt = {"plain": [], "armed": []}
        loop = {"plain": [], "armed": []}
        for block in range(6 if args.quick else 12):
            for name, mesh in (("plain", plain), ("armed", armed)) if block % 2 else (("armed", armed),
                                                                                          ("plain", plain)):
                rt[name] += _round_trips(lambda: mesh.slice(gpus=1).ping.call_one().get(), 20)
                loop[name] += _round_trips(lambda: mesh.slice(gpus=1).spin.call_one(200_000).get(), 2)
        print(f"armed, not paused, vs never armed: call_one round trip {_median_ms(rt['armed']):.2f} vs "
              f"{_median_ms(rt['plain']):.2f} ms ({_median_ms(rt['armed']) / _median_ms(rt['plain']):.2f}x); "
              f"200k-iteration Python loop {_median_ms(loop['armed']):.1f} vs {_median_ms(loop['plain']):.1f} ms "
              f"({_median_ms(loop['armed']) / _median_ms(loop['plain']):.2f}x)", flush=True)
        # With a breakpoint set (never reached), every thread must stay traced.
        bp = dbg.set_breakpoint(Target.halt, mesh="armed")
        traced = _round_trips(lambda: armed.slice(gpus=1).spin.call_one(200_000).get(), reps)
        dbg.clear_breakpoints(bp["id"])
        print(f"with a breakpoint set elsewhere in the mesh (threads traced): 200k-iteration loop "
              f"{_median_ms(traced):.1f} ms ({_median_ms(traced) / _median_ms(loop['plain']):.2f}x never armed)",
              flush=True)
        status = 0
    finally:
        status = max(status, stop_and_check(cluster, _OWN_HOME))
    return status


if __name__ == "__main__":
    sys.exit(main())
