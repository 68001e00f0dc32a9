"""What a call over every actor of a mesh costs each proc, per thread, beside a raw
pyzmq fan-out to as many echo processes and beside the barest Python actor loop, all
measured in the same run on the same machine (issue 24: the call over 128/256 actors).

    .venv/bin/python bench/bench_fanout_cost.py [--hosts 4] [--rounds 300]

Three rounds of the same fan-out over H local hosts x 8 procs (one actor each), in turn:

  raw         a ROUTER sends a small message to each of N echo processes (one DEALER
              each, Python) and takes their N answers
  monarch_nb  ``mesh.ping.call().get()`` over an ``Echo`` mesh, called directly
  bare loop   the same, on a cluster whose procs run ``bare_actor_loop``: receive,
              verify, decode, call, encode, sign, send, nothing else

For each: wall ms per round, and CPU µs per round per proc (from
/proc/PID/task/TID/schedstat), split into libzmq's I/O thread and the Python threads.
On 2 cores every proc's CPU is spent on the same two cores as the caller's, so the
wall time of a call over many actors follows the sum of these. The bare loop is a
floor for any runtime written in Python on this transport: what monarch_nb's own
bookkeeping adds is the difference between the two, and what only a compiled message
path could remove is the difference between the bare loop and raw.

Runs in an isolated MONARCH_NB_HOME; exit status 1 if a process of a cluster is left.
"""

from __future__ import annotations

from tidy import isolated_home, start_cluster, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import zmq  # noqa: E402

from bench_echo import Echo  # noqa: E402
from bench_message_cost import ONE_DEALER, threads  # noqa: E402
from monarch_nb.host.forkserver import PRELOAD_ENV  # noqa: E402
from monarch_nb.protocol import router_ops  # noqa: E402

BENCH = Path(__file__).resolve().parent


def per_proc(pids: list[int], one_round, rounds: int) -> dict[str, float]:
    """Wall ms per round, and CPU µs per round per process of ``pids`` (``io``: libzmq's
    I/O threads; ``python``: every other thread)."""
    for _ in range(20):
        one_round()
    before = {pid: threads(pid) for pid in pids}
    started = time.perf_counter()
    for _ in range(rounds):
        one_round()
    wall = (time.perf_counter() - started) / rounds * 1e3
    cpu = {"io": 0, "python": 0}
    for pid in pids:
        for tid, (name, run, _) in threads(pid).items():
            kind = "io" if name.startswith("ZMQbg") else "python"
            cpu[kind] += run - before[pid].get(tid, (name, 0, 0))[1]
    scale = rounds * len(pids) * 1e3
    return {"wall_ms": wall, "io_us": cpu["io"] / scale, "python_us": cpu["python"] / scale}


def cluster_round(clusters: list, name: str, hosts: int, env: dict[str, str], loop: str):
    """A cluster of ``hosts`` local hosts x 8 procs started with ``env`` added (and put
    in ``clusters`` at once, to be stopped whatever happens next): its procs' pids and
    one direct call over its Echo mesh, whose actors are checked to be served by the
    loop of module ``loop``."""
    cluster = start_cluster(name, env, hosts=hosts)
    clusters.append(cluster)
    procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 8})
    mesh = procs.spawn("echo", Echo)
    served_by = set(mesh.loop_module.call().get().values())
    if served_by != {loop}:
        raise RuntimeError(f"{name}: actors served by {served_by}, not {loop}")
    return list(procs.pids), lambda: mesh.ping.call().get()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    n = args.hosts * 8
    os.environ[router_ops.ROUTER_ENV] = router_ops.ROUTER_OFF  # called directly: one message per actor
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    echoes = [subprocess.Popen([sys.executable, "-c", ONE_DEALER, f"tcp://127.0.0.1:{port}"]) for _ in range(n)]
    clusters = []
    status = 0
    try:
        peers = [router.recv_multipart()[0] for _ in range(n)]

        def raw_round() -> None:
            for peer in peers:
                router.send_multipart([peer, b"x" * 64])
            for _ in peers:
                router.recv_multipart()

        python_path = os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")]))
        full_pids, full_round = cluster_round(clusters, "fanout-cost", args.hosts, {}, "monarch_nb.proc.actor_loop")
        bare_pids, bare_round = cluster_round(clusters, "fanout-bare", args.hosts, {
            PRELOAD_ENV: "bare_actor_loop", "PYTHONPATH": python_path}, "bare_actor_loop")
        print(f"a call over {n} actors ({args.hosts} local hosts x 8), {args.rounds} rounds; "
              "CPU per round per proc")
        print(f"{'':>12} {'wall ms':>8} {'x raw':>6} {'zmq I/O µs':>11} {'Python µs':>10} {'total µs':>9}")
        for _ in range(3):  # in turn, so that all three see the same machine
            raw = per_proc([e.pid for e in echoes], raw_round, args.rounds)
            for label, figures in (("raw", raw), ("monarch_nb", per_proc(full_pids, full_round, args.rounds)),
                                   ("bare loop", per_proc(bare_pids, bare_round, args.rounds))):
                print(f"{label:>12} {figures['wall_ms']:>8.2f} {figures['wall_ms'] / raw['wall_ms']:>5.2f}x "
                      f"{figures['io_us']:>11.1f} {figures['python_us']:>10.1f} "
                      f"{figures['io_us'] + figures['python_us']:>9.1f}", flush=True)
    finally:
        for echo in echoes:
            echo.kill()
            echo.wait()
        ctx.destroy(0)
        for i, cluster in enumerate(clusters):
            status |= stop_and_check(cluster, _OWN_HOME if i == len(clusters) - 1 else None)
    return status


if __name__ == "__main__":
    sys.exit(main())
