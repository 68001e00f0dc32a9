"""Many processes connecting to one inbox at once, with libzmq's default listen backlog
(100) and a large one: the isolated form of the one-second step issue 24 found at ~128 procs.

N client processes (forked, so the same imports) each connect a PUSH socket to one PULL
inbox at the same instant and send one message; the figure is the time from the start
signal until the inbox has all N. When more SYNs arrive than the accept queue holds
(libzmq's ZMQ_BACKLOG, 100 by default; the kernel caps it at net.core.somaxconn), Linux
drops the rest and the clients retry after TCP's initial retransmission timeout: 1 s.

What it shows, and what it does not: here each client has its own zmq context and I/O
thread, whose start staggers the connects, and the inbox's I/O thread is idle, so it
drains the accept queue as fast as the SYNs come: no step at N = 64, 150 or 300 with
either backlog (e.g. 300: 595 vs 601 ms on 2 loaded cores). In a cluster the procs are
already running and connect in one burst (a status request to each; a first call to a
fresh mesh) to an inbox whose I/O thread is busy, and there the queue did overflow:
``nstat -az TcpExtListenOverflows`` counted 35 per 128-proc health() run with the default
backlog and 0 with the kernel's longest (wire/sockets.py ``listen_backlog``), and the
step went (first health() at 128 procs 1,107 -> 177 ms; bench/bench_scale.py).

    .venv/bin/python bench/bench_backlog.py            # N = 64, 128, 256; ~1 min on 2 cores
    .venv/bin/python bench/bench_backlog.py --n 300

Plain zmq, no cluster: it isolates the listening socket. Each N is run three times for
each backlog, interleaved; medians are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import zmq

DEFAULT_BACKLOG = 100  # libzmq's
LARGE_BACKLOG = 4096  # the kernel caps it at net.core.somaxconn


def fan_in(n: int, backlog: int) -> float:
    """Seconds until one inbox (``backlog``) has a message from each of ``n`` processes
    that connect at the same instant."""
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.setsockopt(zmq.LINGER, 0)
    inbox.setsockopt(zmq.BACKLOG, backlog)
    port = inbox.bind_to_random_port("tcp://127.0.0.1")
    go_read, go_write = os.pipe()
    children = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os.close(go_write)
            os.read(go_read, 1)  # every child waits here, then all connect at once
            child = zmq.Context()
            push = child.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 5000)
            push.connect(f"tcp://127.0.0.1:{port}")
            push.send(b"x")
            push.close()
            child.term()
            os._exit(0)
        children.append(pid)
    os.close(go_read)
    time.sleep(0.5)  # (a bench, not a test) let every child reach its read
    start = time.perf_counter()
    os.write(go_write, b"g" * n)
    for _ in range(n):
        inbox.recv()
    elapsed = time.perf_counter() - start
    os.close(go_write)
    for pid in children:
        os.waitpid(pid, 0)
    inbox.close()
    ctx.term()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="*", default=[64, 128, 256])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"somaxconn {open('/proc/sys/net/core/somaxconn').read().strip()}")
    print(f"{'N':>5} {'backlog 100 (libzmq)':>22} {'backlog 4096':>14}")
    for n in args.n:
        runs: dict[int, list[float]] = {DEFAULT_BACKLOG: [], LARGE_BACKLOG: []}
        for _ in range(args.repeat):
            for backlog in runs:
                runs[backlog].append(fan_in(n, backlog))
        before, after = (statistics.median(runs[b]) * 1000 for b in (DEFAULT_BACKLOG, LARGE_BACKLOG))
        print(f"{n:>5} {before:>19.0f} ms {after:>11.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
