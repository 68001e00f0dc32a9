"""Supervision benchmark: from SIGKILL of a proc to the error at the client.

    .venv/bin/python bench/bench_supervision.py [--quick]

Each repetition spawns 2 procs with one actor each, starts a call that keeps both busy
for a minute, SIGKILLs one proc and times until ``get()`` raises SupervisionError
(target: 50 ms; Monarch 0.7 takes ~10 s here, Ray 14 ms, ipyparallel 17 ms). Baseline:
the median round trip of a call to the same 2 actors, measured in the same run.
Runs in an isolated MONARCH_NB_HOME; exit status 1 if a process is left behind.
"""

from __future__ import annotations

from tidy import isolated_home, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from monarch_nb.actor import Actor, SupervisionError, endpoint, this_host  # noqa: E402
from monarch_nb.client import cluster as cluster_mod  # noqa: E402


class Busy(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def wait(self, seconds: float) -> None:
        time.sleep(seconds)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    reps = 5 if args.quick else 20
    host = this_host()
    cluster = cluster_mod._default
    detect, rtt = [], []
    try:
        for i in range(reps):
            procs = host.spawn_procs(per_host={"gpus": 2}, name=f"victims{i}")
            mesh = procs.spawn(f"busy{i}", Busy)
            pids = mesh.pid.call().get().values()
            for _ in range(20):
                t = time.perf_counter()
                mesh.pid.call().get()
                rtt.append(time.perf_counter() - t)
            pending = mesh.wait.call(60)
            t = time.perf_counter()
            os.kill(pids[1], signal.SIGKILL)
            try:
                pending.get(timeout=60)
            except SupervisionError:
                detect.append(time.perf_counter() - t)
            procs.stop()
        med, p99 = statistics.median(detect), max(detect)
        print(f"SIGKILLed proc -> SupervisionError at the client: median {med * 1e3:.1f} ms, max {p99 * 1e3:.1f} ms "
              f"(n={len(detect)}); call round trip to the same 2 actors {statistics.median(rtt) * 1e3:.2f} ms "
              f"(ratio {med / statistics.median(rtt):.1f}); target <= 50 ms: {'met' if med <= 0.05 else 'MISSED'}",
              flush=True)
    finally:
        status = stop_and_check(cluster, _OWN_HOME)
    return status


if __name__ == "__main__":
    sys.exit(main())
