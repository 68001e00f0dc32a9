"""How soon a live health feed (``client.health_watch.HealthWatch``: what a health widget
runs) follows a recovered hub: a retained cluster's hub is SIGKILLed, ``Cluster.recover``
starts a new one, and we time from ``recover()`` returning to the feed's subscription to
the new hub, then from SIGKILLing a proc to the feed showing it failed.

    .venv/bin/python bench/bench_health_feed_recovery.py [--runs 3]

Each run does it twice on the same cluster: with the cluster telling the feed of the new
hub (``Cluster.on_new_hub``), and as the same-run baseline without that notice (the feed
then learns only from ``SILENT_S`` of silence). Prints one JSON line per run. Runs in an
isolated MONARCH_NB_HOME; exit status 1 if a process is left behind.
"""

from __future__ import annotations

from tidy import isolated_home, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import monarch_nb  # noqa: E402
from monarch_nb.client.health_watch import HealthWatch  # noqa: E402

TIMEOUT_S = 60.0


def _wait(condition, timeout: float = TIMEOUT_S) -> float:
    """Seconds until ``condition()`` held (inf if it did not within ``timeout``)."""
    started = time.monotonic()
    done = threading.Event()
    while not condition():
        if time.monotonic() - started > timeout:
            return float("inf")
        done.wait(0.01)
    return time.monotonic() - started


def _state(watch_trees: list, mesh: str, rank: int) -> str | None:
    if not watch_trees:
        return None
    return next((p["state"] for h in watch_trees[-1]["hosts"] for p in h["procs"]
                 if p["proc_mesh"] == mesh and p["rank"] == rank), None)


def one(cluster, told: bool, label: str) -> dict:
    """Kill the hub, recover it, kill a proc; the feed's delays."""
    procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 2}, name=label)
    trees: list = []
    watch = HealthWatch(cluster, trees.append, lambda reason: None, tick_s=3600.0)
    try:
        _wait(lambda: _state(trees, label, 1) == "healthy")
        if not told:
            watch._forget_hub()  # the baseline: the feed is not told of the new hub
        os.kill(cluster._info["hub_pid"], signal.SIGKILL)
        monarch_nb.Cluster.recover(cluster.name)
        subscribed_s = _wait(lambda: watch.subscriptions >= 2)
        os.kill(procs.pids[1], signal.SIGKILL)
        shown_s = _wait(lambda: _state(trees, label, 1) == "failed")
        return {"resubscribed_s": round(subscribed_s, 3), "death_shown_s": round(shown_s, 3)}
    finally:
        watch.stop(5)
        procs.stop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    cluster = monarch_nb.Cluster.start(f"feedrecovery{os.getpid()}", grace_s=60)
    try:
        for run in range(args.runs):
            told = one(cluster, True, f"told{run}")
            silent = one(cluster, False, f"silent{run}")
            print(json.dumps({"run": run, "on_new_hub": told, "baseline_silence": silent}), flush=True)
    finally:
        status = stop_and_check(cluster, _OWN_HOME)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
