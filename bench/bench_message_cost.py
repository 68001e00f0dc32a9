"""Where one call's time goes, per thread: the CPU each thread of the client and of the
proc spends per round trip of ``call_one``, beside two raw pyzmq floors measured in the
same run on the same machine.

    .venv/bin/python bench/bench_message_cost.py [--rounds 3000]

Floors (an echo process; small messages):
  one DEALER   the echo answers on the socket it received on (one TCP connection both ways)
  PULL+PUSH    the echo receives on a PULL inbox and answers through a PUSH socket to the
               sender's inbox: the topology monarch_nb uses (a reply goes to the caller's
               own inbox, on a connection of its own)

For each: round-trip wall time, and CPU per round trip of every thread that did work
(from /proc/PID/task/TID/schedstat: nanoseconds on a CPU, and context switches), in the
echo (or proc) and in this process; the three are measured in turn, twice. On the
2-core test machine with CI running beside it (2026-12-07): a round trip of call_one took
~500 µs against 53-110 µs raw; the proc's actor thread spent 92-100 µs of CPU a call and
the client's calling thread 150-175 µs, against 5-24 µs for the raw echoes' Python
threads, while the zmq I/O threads spent 19-30 µs (raw: 10-54 µs). What is left to win
is in the Python of the call path on both sides, not in zmq. (The raw floors moved by 2x
between rounds there: compare within a round.)

Runs in an isolated MONARCH_NB_HOME; exit status 1 if a process of its cluster is left.
"""

from __future__ import annotations

from tidy import WATCH_PARENT, isolated_home, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import zmq  # noqa: E402

import monarch_nb  # noqa: E402

ONE_DEALER = WATCH_PARENT + r"""
import zmq
s = zmq.Context().socket(zmq.DEALER)
s.connect(sys.argv[1])
s.send(b"ready")
while True:
    s.send(s.recv())
"""

PULL_PUSH = WATCH_PARENT + r"""
import zmq
ctx = zmq.Context()
inbox = ctx.socket(zmq.PULL)
port = inbox.bind_to_random_port("tcp://127.0.0.1")
out = ctx.socket(zmq.PUSH)
out.connect(sys.argv[1])
out.send(str(port).encode())
while True:
    out.send(inbox.recv())
"""

PAYLOAD = b"x" * 100


def threads(pid: int) -> dict[int, tuple[str, int, int]]:
    """tid -> (name, ns on a CPU, context switches) for every thread of ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            run, _, switches = map(int, Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split())
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        out[int(tid)] = (name, run, switches)
    return out


def per_round(before: dict, after: dict, rounds: int) -> list[tuple[str, float, float]]:
    """(thread name, µs on a CPU, context switches) per round, for threads that worked."""
    rows = []
    for tid, (name, run, switches) in after.items():
        _, run0, switches0 = before.get(tid, (name, 0, 0))
        if run - run0 > rounds * 500:  # more than 0.5 µs a round
            rows.append((name, (run - run0) / rounds / 1e3, (switches - switches0) / rounds))
    return sorted(rows, key=lambda r: -r[1])


def measure(label: str, pid: int, one_round, rounds: int) -> None:
    for _ in range(200):
        one_round()
    far, near = threads(pid), threads(os.getpid())
    started = time.perf_counter()
    for _ in range(rounds):
        one_round()
    wall = (time.perf_counter() - started) / rounds * 1e6
    print(f"\n{label}: {wall:.0f} µs a round trip")
    for side, rows in (("  far side", per_round(far, threads(pid), rounds)),
                       ("  this side", per_round(near, threads(os.getpid()), rounds))):
        total = sum(r[1] for r in rows)
        print(f"{side}: {total:.1f} µs CPU a round trip")
        for name, cpu, switches in rows:
            print(f"    {name:<24} {cpu:7.1f} µs  {switches:4.2f} switches")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3000)
    rounds = parser.parse_args().rounds
    ctx = zmq.Context()
    helpers: list[subprocess.Popen] = []
    try:
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        helpers.append(subprocess.Popen([sys.executable, "-c", ONE_DEALER, f"tcp://127.0.0.1:{port}"]))
        peer = router.recv_multipart()[0]

        def dealer_round() -> None:
            router.send_multipart([peer, PAYLOAD])
            router.recv_multipart()

        inbox = ctx.socket(zmq.PULL)
        inbox_port = inbox.bind_to_random_port("tcp://127.0.0.1")
        helpers.append(subprocess.Popen([sys.executable, "-c", PULL_PUSH, f"tcp://127.0.0.1:{inbox_port}"]))
        out = ctx.socket(zmq.PUSH)
        out.connect(f"tcp://127.0.0.1:{int(inbox.recv())}")

        def push_round() -> None:
            out.send(PAYLOAD)
            inbox.recv()

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_echo import Echo

        cluster = monarch_nb.Cluster.start_ephemeral()
        try:
            procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 1})
            mesh = procs.spawn("echo", Echo)
            pid = procs.pids[0]
            for _ in range(2):  # interleaved, so that all three see the same machine
                measure("raw, one DEALER", helpers[0].pid, dealer_round, rounds)
                measure("raw, PULL+PUSH", helpers[1].pid, push_round, rounds)
                measure("monarch_nb call_one", pid, lambda: mesh.ping.call_one(None).get(), rounds)
        finally:
            status = stop_and_check(cluster, _OWN_HOME)
        return status
    finally:
        for helper in helpers:
            helper.kill()
            helper.wait()
        ctx.destroy(0)



if __name__ == "__main__":
    sys.exit(main())
