"""Spawn with the host's forkserver against fresh interpreters (issue 24 item 6).

    .venv/bin/python bench/bench_forkserver.py [--sizes 8 32 128] [--reps 2] [--preload torch]

For each N, interleaved in one run: the floor, N bare interpreters importing what a proc
imports (``python -c 'import monarch_nb.proc.__main__'``) started in parallel and waited
for; ``spawn_procs(per_host={"gpus": N})`` on a cluster whose agent forks procs (the
default); and the same on a cluster started with ``MONARCH_NB_FORKSERVER=0`` (every proc
a fresh interpreter, as before the forkserver). Medians of ``reps`` seconds.

Then a full ``gc.collect()`` in each of 8 procs that imported ``--preload`` (default
``torch``, where it is installed): its CPU ms and the proc's unique and proportional
memory after it (USS, PSS), on two clusters of their own: procs forked from a forkserver
that preloaded it (``MONARCH_NB_PROC_PRELOAD``), whose collections skip what it imported
(``host.forkserver``), against fresh interpreters that import it first.

Runs in an isolated MONARCH_NB_HOME; exit status 1 if a process is left behind.
"""

from __future__ import annotations

from tidy import bare_interpreters, isolated_home, start_cluster, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import monarch_nb  # noqa: E402
from monarch_nb.host.forkserver import PRELOAD_ENV  # noqa: E402
from monarch_nb.host.proc_launcher import FORKSERVER_ENV  # noqa: E402


def spawn(cluster, n: int, i: int) -> float:
    started = time.perf_counter()
    procs = cluster.host_mesh().spawn_procs(per_host={"gpus": n}, name=f"p{n}_{i}")
    took = time.perf_counter() - started
    procs.stop().get()
    return took


def collections(name: str, preload: str, forked: bool, own_home: str | None,
                procs: int = 8) -> tuple[dict[str, float], int]:
    """Median over ``procs`` procs of a full collection's figures (``Collector``), on a
    cluster of its own whose procs have imported ``preload``: forked from a forkserver
    that preloaded it, or fresh interpreters that import it first. Also returns
    :func:`stop_and_check`'s status."""
    from bench_echo import Collector

    cluster = start_cluster(name, {PRELOAD_ENV: preload} if forked else {FORKSERVER_ENV: "0"})
    try:
        mesh = cluster.host_mesh().spawn_procs(per_host={"gpus": procs})
        figures = [f for _, f in mesh.spawn("collector", Collector).collect.call(preload).get()]
        mesh.stop().get()
    finally:
        status = stop_and_check(cluster, own_home)
    return {key: statistics.median(f[key] for f in figures) for key in figures[0]}, status


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--preload", default="torch" if importlib.util.find_spec("torch") else "",
                        help="what the procs of the collection figures import (MONARCH_NB_PROC_PRELOAD where forked; "
                             "default: torch, where installed)")
    args = parser.parse_args()
    forked = monarch_nb.Cluster.start("bench-forked")
    fresh = start_cluster("bench-fresh", {FORKSERVER_ENV: "0"})
    print(f"spawn_procs(per_host={{'gpus': N}}), seconds (median of {args.reps}); "
          f"floor: N interpreters importing what a proc imports, in parallel")
    print(f"{'N':>5} {'floor':>8} {'fresh':>8} {'forked':>8} {'forked/floor':>13} {'fresh/forked':>13}")
    try:
        for n in args.sizes:
            runs: dict[str, list[float]] = {"floor": [], "fresh": [], "forked": []}
            for i in range(args.reps):
                runs["floor"].append(bare_interpreters(n))
                runs["fresh"].append(spawn(fresh, n, i))
                runs["forked"].append(spawn(forked, n, i))
            floor, cold, warm = (statistics.median(runs[k]) for k in ("floor", "fresh", "forked"))
            print(f"{n:>5} {floor:>8.2f} {cold:>8.2f} {warm:>8.2f} {warm / floor:>12.2f}x {cold / warm:>12.1f}x",
                  flush=True)
    finally:
        status = stop_and_check(fresh, None)
        status |= stop_and_check(forked, None)
    print(f"\na full gc.collect() in a proc that imported {args.preload or 'nothing more'} (median of 8 procs)")
    print(f"{'':>7} {'CPU ms':>8} {'USS MiB':>8} {'PSS MiB':>8}")
    for name, is_forked in (("fresh", False), ("forked", True)):
        gc_figures, left = collections(f"bench-gc-{name}", args.preload, is_forked, _OWN_HOME if is_forked else None)
        status |= left
        print(f"{name:>7} {gc_figures['gc_cpu_ms']:>8.1f} {gc_figures['uss_mib']:>8.1f} "
              f"{gc_figures['pss_mib']:>8.1f}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
