"""Host losses under CPU starvation: a cluster beside busy-loop processes.

    .venv/bin/python bench/bench_host_loss.py [--hogs 16] [--seconds 180] [--hosts 2]

Starts a retained cluster of ``--hosts`` local host agents with 2 procs each (one
actor per proc), then ``--hogs`` processes that spin on the CPU (``while True: pass``,
the same priority as the cluster) for ``--seconds``. Meanwhile it calls every actor
about once a second (each call bounded at 120 s) and reads the hub's ``info``.

It reports: the load average reached, hosts the hub declared lost (``silent for`` in
hub.log) and taken back, calls that failed, the longest call, the longest silence of
an agent the hub saw (``info``'s ``silent_s`` sampled, and the hub's own record of
starved silences where it has one), the hub's own stalls, and spawns during the load.

Runs in an isolated MONARCH_NB_HOME; exit status 1 if a process is left behind.
"""

from __future__ import annotations

from tidy import WATCH_PARENT, isolated_home, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from monarch_nb.actor import Actor, endpoint  # noqa: E402
from monarch_nb.client.cluster import Cluster  # noqa: E402
from monarch_nb.client.launch import HUB_LOG  # noqa: E402


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hogs", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--hosts", type=int, default=2)
    args = parser.parse_args()
    cluster = Cluster.start(f"hostloss{os.getpid()}", hosts=args.hosts)
    hogs: list[subprocess.Popen] = []
    failures: list[str] = []
    longest_call = 0.0
    longest_silence = 0.0
    calls = spawns = spawn_failures = 0
    peak_load = 0.0
    try:
        mesh = cluster.host_mesh().spawn_procs(per_host={"gpus": 2}, name="p").spawn("pid", Pid)
        pids = mesh.pid.call().get(timeout=120).values()
        hogs = [subprocess.Popen([sys.executable, "-c", WATCH_PARENT + "\nwhile True: pass\n"])
                for _ in range(args.hogs)]
        end = time.monotonic() + args.seconds
        next_spawn = time.monotonic() + 30
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                got = mesh.pid.call().get(timeout=120).values()
                if got != pids:
                    failures.append(f"pids changed: {got}")
            except Exception as e:  # noqa: BLE001 - counted and reported
                failures.append(f"{type(e).__name__}: {str(e)[:200]}")
            longest_call = max(longest_call, time.monotonic() - t0)
            calls += 1
            try:
                info = cluster.info()
                longest_silence = max([longest_silence] + [h["silent_s"] for h in info["hosts"]])
            except Exception as e:  # noqa: BLE001
                failures.append(f"info: {type(e).__name__}: {str(e)[:200]}")
            if time.monotonic() > next_spawn:  # a spawn under load: refused if a host was lost
                next_spawn = time.monotonic() + 30
                spawns += 1
                try:
                    cluster.host_mesh().spawn_procs(per_host={"gpus": 1}, name=f"s{spawns}").stop()
                except Exception as e:  # noqa: BLE001
                    spawn_failures += 1
                    failures.append(f"spawn: {type(e).__name__}: {str(e)[:200]}")
            peak_load = max(peak_load, os.getloadavg()[0])
            time.sleep(1.0)
        info = cluster.info()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    log = (cluster.path / HUB_LOG).read_text(errors="replace")
    print(f"{args.hogs} busy loops beside a {args.hosts}-host cluster for {args.seconds:.0f} s "
          f"on {os.cpu_count()} CPUs; peak load average {peak_load:.1f}")
    print(f"  hosts declared lost: {log.count('silent for')}; taken back: {log.count('heard from again')}")
    print(f"  calls: {calls}, failed: {len([f for f in failures if not f.startswith(('info', 'spawn'))])}, "
          f"longest {longest_call:.2f} s")
    print(f"  spawns under load: {spawns}, refused or failed: {spawn_failures}")
    print(f"  longest agent silence sampled: {longest_silence:.2f} s; hub stalls: {info['hub_stats']['stalls']}")
    for host in info["hosts"]:
        extra = {k: host[k] for k in ("starved", "longest_silence_s") if k in host}
        print(f"  {host['host_id']}: lost={host['lost']} heartbeats={host['heartbeats']} {extra}")
    for f in failures[:10]:
        print(f"  failure: {f}")
    return stop_and_check(cluster, _OWN_HOME)


if __name__ == "__main__":
    sys.exit(main())
