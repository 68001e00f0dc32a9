"""Health widget benchmark: how fast the live tree shows a dead proc, and what keeping it
live costs.

    .venv/bin/python bench/bench_health_widget.py [--quick]

1. SIGKILL of a proc -> the widget's model shows it ``failed`` (the ipywidgets state a
   frontend renders; no browser here). Baseline, same repetitions: SIGKILL -> the
   hub's ``actors_gone`` event reaching this process (the floor for any display that
   follows events). For comparison, in other repetitions: SIGKILL -> the first
   ``cluster.health()`` showing it failed, asked in a tight loop (a poller at its best).
2. Refreshes per second of a displayed widget: idle (only the 1 s tick), and while
   meshes are spawned and stopped back to back (an event storm; the cap is 4/s).
3. One refresh: ``cluster.health()`` round trip and the widget's update of an
   8-proc tree, medians.

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

from monarch_nb.actor import Actor, endpoint, this_host  # noqa: E402
from monarch_nb.client.runtime import runtime  # noqa: E402
from monarch_nb.notebook.health_widget import HealthWidget  # noqa: E402


class Idle(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def _proc_state(tree: dict, pid: int) -> str | None:
    return next((p["state"] for h in tree["hosts"] for p in h["procs"] if p["pid"] == pid), None)


def _wait(condition, timeout: float = 30.0) -> None:
    deadline = time.perf_counter() + timeout
    while not condition():
        if time.perf_counter() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.001)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    reps = 4 if args.quick else 16
    host = this_host()
    cluster = runtime().cluster
    widget_s, event_s, poll_s = [], [], []
    heard: list[float] = []
    unsubscribe = runtime().events.subscribe(lambda h: heard.append(time.perf_counter()) if h["op"] == "actors_gone" else None)
    try:
        widget = HealthWidget(cluster)
        for i in range(reps):
            procs = host.spawn_procs(per_host={"gpus": 2}, name=f"victims{i}")
            pids = procs.spawn(f"idle{i}", Idle).pid.call().get().values()
            key = f"proc:victims{i}/1"
            _wait(lambda: widget.state_of(key) == "healthy")
            time.sleep(0.3)  # the widget at rest, as when a user watches it
            heard.clear()
            t = time.perf_counter()
            os.kill(pids[1], signal.SIGKILL)
            if i % 4 != 3:  # interleaved, so both see the same machine state
                _wait(lambda: widget.state_of(key) == "failed")
                widget_s.append(time.perf_counter() - t)
                event_s.append(heard[0] - t)
            else:
                _wait(lambda: _proc_state(cluster.health(), pids[1]) == "failed")
                poll_s.append(time.perf_counter() - t)
            procs.stop()
        w, e = statistics.median(widget_s), statistics.median(event_s)
        print(f"1. SIGKILL -> widget shows failed: median {w * 1e3:.1f} ms, max {max(widget_s) * 1e3:.0f} ms "
              f"(n={len(widget_s)}); -> actors_gone event here: median {e * 1e3:.1f} ms (ratio {w / e:.1f}); "
              f"tight health() polling: median {statistics.median(poll_s) * 1e3:.0f} ms (n={len(poll_s)}; "
              "health() waits up to 1 s for a dead proc's status until the hub has reaped it)", flush=True)

        procs = host.spawn_procs(per_host={"gpus": 8}, name="eight")
        procs.spawn("idle8", Idle).pid.call().get()
        _wait(lambda: widget.state_of("proc:eight/7") == "healthy")
        window = 3.0 if args.quick else 6.0
        before = widget.refreshes
        time.sleep(window)
        idle_rate = (widget.refreshes - before) / window
        before, t = widget.refreshes, time.perf_counter()
        n = 0
        while time.perf_counter() - t < window:
            host.spawn_procs(per_host={"gpus": 1}, name=f"storm{n}").stop()
            n += 1
        storm_rate = (widget.refreshes - before) / (time.perf_counter() - t)
        print(f"2. refreshes/s: idle {idle_rate:.2f} (tick 1 s); during {n} spawn+stop in {window:.0f} s "
              f"{storm_rate:.2f} (cap 4)", flush=True)

        health_s, update_s = [], []
        for _ in range(20 if args.quick else 60):
            t = time.perf_counter()
            tree = cluster.health()
            health_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            widget._show(tree)
            update_s.append(time.perf_counter() - t)
        print(f"3. one refresh of an {sum(len(h['procs']) for h in tree['hosts'])}-proc tree: health() "
              f"{statistics.median(health_s) * 1e3:.1f} ms, widget update {statistics.median(update_s) * 1e3:.1f} ms "
              f"(ratio {statistics.median(update_s) / statistics.median(health_s):.1f})", flush=True)
        widget.close()
    finally:
        unsubscribe()
        status = stop_and_check(cluster, _OWN_HOME)
    return status


if __name__ == "__main__":
    sys.exit(main())
