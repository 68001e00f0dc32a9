"""What keeping the health tree current costs as procs grow: ``health()`` and the CPU of
the hub, the host agent and the procs per second with 0, 1 and 4 live feeds open (a
feed is what a health widget, ``%monarch status --watch`` or ``monarch-nb cluster status
--watch`` runs: ``client.health_watch.HealthWatch``, here without a display).

    .venv/bin/python bench/bench_health_feed.py [--sizes 64 128 256] [--window 5]

For each size N: spawn N procs on one host with one idle actor each; the CPU per second
with nobody watching (no feed, no ``health()`` for ``QUIET_S``: row ``idle``); ``health()`` first
and median of 10 (ms) with the hub's CPU per call; then, over ``--window`` seconds each,
CPU per second (ms/s: 1000 is one core) of the hub, the host agent and all procs
together, and the trees the feeds received per second. The ``idle`` row is the same-run
baseline: what the cluster costs with nobody watching; the 0-feed row follows ``health()``
calls (host agents keep statuses fresh for 30 s after one). The script runs against whatever
monarch_nb is importable (``PYTHONPATH=/tmp/before`` measures an older tree the same way).
Runs in an isolated MONARCH_NB_HOME; exit status 1 if a process is left behind.
"""

from __future__ import annotations

from tidy import isolated_home, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import psutil  # noqa: E402

import monarch_nb  # noqa: E402
from monarch_nb.actor import Actor, endpoint, this_host  # noqa: E402
from monarch_nb.client.health_watch import HealthWatch  # noqa: E402
from monarch_nb.client.runtime import runtime  # noqa: E402


QUIET_S = 32.0  # past the hub's WANTED_AFTER_HEALTH_S: nobody watches any more


class Idle(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def _cpu(processes: list[psutil.Process]) -> float:
    total = 0.0
    for p in processes:
        try:
            total += sum(p.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


def _roles(hub: psutil.Process, pids: set[int]) -> dict[str, list[psutil.Process]]:
    agents = hub.children()
    procs = [psutil.Process(pid) for pid in pids if psutil.pid_exists(pid)]
    return {"hub": [hub], "agent": agents, "procs": procs}


def _all_healthy(cluster, n: int, name: str) -> bool:
    tree = cluster.health()
    procs = [p for h in tree["hosts"] for p in h["procs"] if p["proc_mesh"] == name]
    return len(procs) == n and all(p["state"] == "healthy" for p in procs)


def measure(cluster, n: int, window: float, last_watched: list[float]) -> dict:
    name = f"n{n}"
    procs = this_host().spawn_procs(per_host={"gpus": n}, name=name)
    try:
        procs.spawn(f"idle{n}", Idle).ping.call().get()
        hub = psutil.Process(cluster._info["hub_pid"])
        roles = _roles(hub, set(procs.pids))
        time.sleep(max(2.0, QUIET_S - (time.monotonic() - last_watched[0])))
        before = {role: _cpu(ps) for role, ps in roles.items()}
        time.sleep(window)
        idle = {f"{role}_cpu_ms_per_s_idle": (_cpu(ps) - before[role]) / window * 1e3 for role, ps in roles.items()}
        deadline = time.monotonic() + 60
        while not _all_healthy(cluster, n, name) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.0)  # heartbeats carry every proc's status by now (where they do)
        row: dict = {"procs": n, **idle, "trees_per_s_idle": 0.0}
        started = time.perf_counter()
        cluster.health()
        row["first_health_ms"] = (time.perf_counter() - started) * 1e3
        walls, cpu = [], _cpu([hub])
        for _ in range(10):
            started = time.perf_counter()
            cluster.health()
            walls.append(time.perf_counter() - started)
        row["health_ms"] = statistics.median(walls) * 1e3
        row["hub_cpu_per_health_ms"] = (_cpu([hub]) - cpu) / 10 * 1e3
        for feeds in (0, 1, 4):
            got = [0] * feeds
            watches = [HealthWatch(cluster, lambda tree, i=i: got.__setitem__(i, got[i] + 1), lambda why: None)
                       for i in range(feeds)]
            try:
                deadline = time.monotonic() + 30
                while not all(got) and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(1.0)  # past the first round
                before = {role: _cpu(ps) for role, ps in roles.items()}
                trees = sum(got)
                time.sleep(window)
                for role, ps in roles.items():
                    row[f"{role}_cpu_ms_per_s_{feeds}"] = (_cpu(ps) - before[role]) / window * 1e3
                row[f"trees_per_s_{feeds}"] = (sum(got) - trees) / window
            finally:
                for w in watches:
                    w.stop(5)
        return row
    finally:
        last_watched[0] = time.monotonic()
        procs.stop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="*", default=[64, 128, 256])
    parser.add_argument("--window", type=float, default=5.0, help="seconds each CPU figure is measured over")
    parser.add_argument("--json", type=str, default="", help="also write the rows here")
    args = parser.parse_args()
    this_host()
    cluster = runtime().cluster
    rows = []
    last_watched = [time.monotonic()]
    try:
        print(f"monarch_nb at {monarch_nb.__file__}", flush=True)
        print("| procs | first health() ms | health() ms | hub CPU per health() ms | feeds | hub CPU ms/s | "
              "agent CPU ms/s | procs CPU ms/s | trees/s |", flush=True)
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
        for n in args.sizes:
            row = measure(cluster, n, args.window, last_watched)
            rows.append(row)
            for feeds in ("idle", 0, 1, 4):
                head = (f"| {n} | {row['first_health_ms']:.0f} | {row['health_ms']:.1f} | "
                        f"{row['hub_cpu_per_health_ms']:.1f} " if feeds == "idle" else "| | | | ")
                print(f"{head}| {feeds} | {row[f'hub_cpu_ms_per_s_{feeds}']:.0f} | "
                      f"{row[f'agent_cpu_ms_per_s_{feeds}']:.0f} | {row[f'procs_cpu_ms_per_s_{feeds}']:.0f} | "
                      f"{row[f'trees_per_s_{feeds}']:.2f} |", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    finally:
        status = stop_and_check(cluster, _OWN_HOME)
    return status


if __name__ == "__main__":
    sys.exit(main())
