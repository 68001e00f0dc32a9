"""Many procs lost at once (issue 24's "256 procs dying at once -> every waiting caller
has its SupervisionError within 1 s"), as seen by the callers.

    .venv/bin/python bench/bench_mass_death.py [--procs 256] [--hosts 32] [--threads 4] [--case procs|hosts|both]

Two cases, each first at a small size (the baseline the 50 ms figure of
bench_supervision.py is known for, measured in the same run), then at the sizes asked:

``procs killed``  N procs on one host agent (8, then ``--procs``), one actor each;
                  every proc SIGKILLed at once (its host agent reports each exit).
``hosts lost``    H local host agents x 8 procs (1, then ``--hosts``); every host agent
                  SIGKILLed at once (its procs die with it; the local allocator sees the
                  agents' exits at its next poll, once a second).

Before the kill, callers wait on every actor: one ``call`` over the whole mesh to an
endpoint that sleeps 60 s, then one ``call_one`` to every rank (queued behind it);
``--threads`` threads block in ``get()``, one on the whole-mesh call and the others on
rank calls spread over the mesh, and the main thread waits on all of them. Figures,
from the first SIGKILL:

  every call   first, median and max time until each of the N + 1 calls is failed with
               ``SupervisionError`` (its future resolved), ms. For lost hosts the first
               is when the hub found them (the allocator's poll: 0 to 1 s after the
               kill, by chance), and max - first the burst's own cost
  floor        SIGKILL of as many idle interpreters importing what a proc imports,
               until this process reaped them all: the OS's own share, ms
  threads      max time until each blocked thread has its ``SupervisionError``, ms
  named        ranks the whole-mesh call's error names (those known dead when it
               failed: a proc's death fails it at once)
  hub CPU      the hub's CPU (scheduler time of all its threads) from the kill until
               it is idle again (under 10 ms of CPU in 0.5 s), ms; and per lost proc
  agent CPU    the same for the host agent (procs killed only: a killed agent's is gone)
  client CPU   this process's CPU from the kill until the last call failed, ms

Runs in an isolated MONARCH_NB_HOME; exit status 1 if a process is left behind or a
call ended otherwise than with ``SupervisionError``.
"""

from __future__ import annotations

from tidy import WATCH_PARENT, isolated_home, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import psutil  # noqa: E402

from monarch_nb.actor import SupervisionError  # noqa: E402
from monarch_nb.client import cluster as cluster_mod  # noqa: E402
from monarch_nb.client.runtime import runtime  # noqa: E402

from bench_echo import Busy  # noqa: E402

WAIT_S = 60.0  # how long the waiting endpoint sleeps: far past any figure here
IDLE_CPU_S = 0.01  # the hub is idle again once it uses less than this ...
IDLE_WINDOW_S = 0.5  # ... in this long
# How long host agents wait for a silent hub before they stop their procs: the spawn of
# 256 procs on 32 local agents can stall a 2-core machine's hub past the ephemeral 2 s.
AGENT_GRACE_S = 30.0


def _one(mesh, rank: int):
    """The one-actor slice of ``mesh`` at ``rank``."""
    return mesh.slice(**dict(mesh.extent.point(rank)))


def _cpu(process: psutil.Process) -> float:
    """``process``'s CPU seconds: the sum over its threads of /proc's scheduler time (ns;
    psutil's user+system counts 10 ms ticks, too coarse for the 8-proc baseline)."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{process.pid}/task"):
            with open(f"/proc/{process.pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, ValueError):
        times = process.cpu_times()
        return times.user + times.system


def _idle_cpu(process: psutil.Process) -> float:
    """``process``'s CPU seconds once it is idle (see IDLE_CPU_S)."""
    before = _cpu(process)
    while True:
        time.sleep(IDLE_WINDOW_S)
        now = _cpu(process)
        if now - before < IDLE_CPU_S:
            return now
        before = now


# A floor process: imports what a proc imports, says so, then waits to be killed.
WAITING_INTERPRETER = WATCH_PARENT + """
import monarch_nb.proc.__main__
sys.stdout.write("ready\\n"); sys.stdout.flush()
time.sleep(3600)
"""


def kill_floor(n: int) -> float:
    """Seconds from SIGKILL of ``n`` idle interpreters (as large as procs: they import
    what a proc imports) until this process has reaped every one: what the OS alone
    takes to end that many processes here."""
    children = [subprocess.Popen([sys.executable, "-c", WAITING_INTERPRETER], stdout=subprocess.PIPE)
                for _ in range(n)]
    try:
        for child in children:
            child.stdout.readline()
        started = time.perf_counter()
        for child in children:
            child.kill()
        for child in children:
            child.wait()
        return time.perf_counter() - started
    finally:
        for child in children:
            child.kill()
            child.wait()
            child.stdout.close()


def measure(hosts: int, per_host: int, kill_agents: bool, threads: int) -> dict:
    """Kill every proc (or every host agent) of a fresh ``hosts`` x ``per_host`` cluster
    under waiting callers; the figures of the module docstring."""
    n = hosts * per_host
    cluster = cluster_mod.Cluster.start_ephemeral(hosts=hosts, grace_s=AGENT_GRACE_S)
    row: dict = {"hosts": hosts, "procs": n}
    try:
        procs = cluster.host_mesh().spawn_procs(per_host={"gpus": per_host}, name="victims")
        mesh = procs.spawn("victims", Busy)
        pids = list(mesh.pid.call().get().values())
        agents = [h["pid"] for h in cluster.info()["hosts"]]
        hub = psutil.Process(cluster._hub_process.pid)
        agent_processes = [psutil.Process(pid) for pid in agents]

        ended: dict[int, float] = {}  # call index -> when its future resolved

        def note(i: int):
            def done(_future) -> None:
                ended[i] = time.perf_counter()
            return done

        calls = [mesh.wait.call(WAIT_S)] + [_one(mesh, r).wait.call_one(WAIT_S) for r in range(n)]
        for i, call in enumerate(calls):
            call.add_done_callback(note(i))
        # Each thread blocks on one call: the whole mesh's, then ranks spread over it.
        watched = [0] + [1 + (k * n) // threads for k in range(1, threads)]
        woken: list[float] = []

        def block(i: int) -> None:
            try:
                calls[i].get(timeout=WAIT_S)
            except SupervisionError:
                woken.append(time.perf_counter())

        waiters = [threading.Thread(target=block, args=(i,), daemon=True) for i in watched]
        for t in waiters:
            t.start()
        time.sleep(1.0)  # the calls have reached their actors (a bench, not a test: no event to wait on)
        assert not ended, "a call ended before the kill"

        cpu_hub, cpu_client = _cpu(hub), time.process_time()
        cpu_agent = _cpu(agent_processes[0])  # (the one agent, where procs are killed)
        started = time.perf_counter()
        for pid in agents if kill_agents else pids:
            os.kill(pid, signal.SIGKILL)
        # This thread waits on every call too: replies are dispatched by the threads that
        # wait (a blocked thread whose own call failed stops dispatching the others').
        runtime().mailbox.wait(lambda: len(ended) == len(calls), WAIT_S)
        for t in waiters:
            t.join(WAIT_S)
        row["client_cpu_ms"] = (time.process_time() - cpu_client) * 1e3
        row["hub_cpu_ms"] = (_idle_cpu(hub) - cpu_hub) * 1e3
        row["hub_cpu_per_proc_ms"] = row["hub_cpu_ms"] / n
        # (killed agents have no figure: their CPU is gone with them)
        row["agent_cpu_ms"] = float("nan") if kill_agents else (_idle_cpu(agent_processes[0]) - cpu_agent) * 1e3

        times = [ended[i] - started for i in sorted(ended)]
        errors = {i: calls[i].exception(timeout=0) for i in ended}
        row["calls"], row["failed"] = len(calls), sum(isinstance(errors[i], SupervisionError) for i in errors)
        row["first_ms"], row["median_ms"], row["max_ms"] = (min(times) * 1e3, statistics.median(times) * 1e3,
                                                            max(times) * 1e3)
        row["threads_max_ms"] = (max(woken) - started) * 1e3 if len(woken) == len(waiters) else float("nan")
        found = re.search(r"\((\d+) of \d+ ranks\)", str(errors.get(0)))
        row["named"] = int(found.group(1)) if found else (1 if isinstance(errors.get(0), SupervisionError) else 0)
        row["ok"] = row["failed"] == len(calls) and len(woken) == len(waiters)
    finally:
        row["left_behind"] = stop_and_check(cluster, None)
    return row


COLUMNS = [("hosts", "{:d}"), ("procs", "{:d}"), ("calls", "{:d}"), ("failed", "{:d}"), ("first_ms", "{:.0f}"), ("median_ms", "{:.0f}"),
           ("max_ms", "{:.0f}"), ("floor_ms", "{:.0f}"), ("threads_max_ms", "{:.0f}"), ("named", "{:d}"), ("hub_cpu_ms", "{:.0f}"),
           ("hub_cpu_per_proc_ms", "{:.2f}"), ("agent_cpu_ms", "{:.0f}"),
           ("client_cpu_ms", "{:.0f}")]


def table(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print("  ".join(name for name, _ in COLUMNS))
    for row in rows:
        print("  ".join(fmt.format(row[name]).rjust(len(name)) for name, fmt in COLUMNS))
    small, large = rows[0], rows[-1]
    print(f"  {large['procs']} vs {small['procs']} procs: max {large['max_ms'] / small['max_ms']:.1f}x, "
          f"hub CPU per proc {large['hub_cpu_per_proc_ms'] / small['hub_cpu_per_proc_ms']:.2f}x; "
          f"every call failed within 1 s at {large['procs']}: {'yes' if large['max_ms'] <= 1000 else 'NO'}",
          flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--procs", type=int, nargs="+", default=[256], help="procs on one host agent, all SIGKILLed")
    parser.add_argument("--hosts", type=int, nargs="+", default=[32], help="local host agents of 8 procs, all SIGKILLed")
    parser.add_argument("--threads", type=int, default=4, help="threads blocked in get()")
    parser.add_argument("--case", choices=["procs", "hosts", "both"], default="both")
    args = parser.parse_args()
    print(f"monarch_nb mass death bench: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
    status = 0
    try:
        cases = [("procs", "procs killed (one host agent)", [(1, 8)] + [(1, n) for n in args.procs], False),
                 ("hosts", "hosts lost (agents killed, 8 procs each)", [(1, 8)] + [(h, 8) for h in args.hosts], True)]
        for case, title, shapes, kill_agents in cases:
            if args.case not in (case, "both"):
                continue
            rows = []
            for hosts, per_host in shapes:
                print(f"{title}: {hosts} x {per_host} ...", flush=True)
                row = measure(hosts, per_host, kill_agents, args.threads)
                row["floor_ms"] = kill_floor(hosts * per_host) * 1e3
                status |= row.pop("left_behind") | (not row["ok"])
                rows.append(row)
            table(title, rows)
    finally:
        if _OWN_HOME:
            shutil.rmtree(_OWN_HOME, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
