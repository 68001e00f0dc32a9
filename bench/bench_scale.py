"""How monarch_nb's costs grow with procs and hosts (issue 24), each figure beside a floor
measured in the same run on the same number of processes.

    .venv/bin/python bench/bench_scale.py [--sizes 8 32 128] [--hosts 1 4 16] [--out DIR]

Two topologies: N procs on one host agent (``--sizes``), and H local host agents x 8
procs (``--hosts``; every "host" is an agent process on this machine, as the local
allocator makes them). For each, a retained cluster is started, and:

  spawn        ``spawn_procs`` seconds; floor: N bare interpreters importing what a proc
               imports (``python -c 'import monarch_nb.proc.__main__'``), in parallel
  actors       ``procs.spawn`` of one actor per proc, seconds
  first call   the first ``call().get()`` on that fresh mesh, ms
  call all     median ``call().get()`` over all N actors, ms; floor: a raw pyzmq round to N
               echo processes (ROUTER -> N DEALERs -> back), same N, same machine
  routed       over several hosts, the same calls through the host routers
               (``MONARCH_NB_ROUTER=on``, ``host.router``) beside the direct ones, same
               mesh, same run, two ways (and the first call to a fresh mesh spawned each way): ``routed``, one message from the client to
               each host's router (the default), and ``relayed``, one message to the
               client's relay router, which passes it on (``MONARCH_NB_ROUTER_RELAY=on``):
               call all, ``reduce(operator.add)``, the client's CPU per
               call (ms: its process's user+system time, which also counts its zmq I/O
               thread and ~15 ms/s of background threads; and the calling thread's alone,
               which encodes, sends, receives and decodes) and the messages its mailbox
               receives per call (a router's batch counts once); and the open files of a
               fresh client that picked the mesh and called it twice, each way, and
               its connect + handles + first call (ms, the import of its modules apart)
  broadcast    median client-side cost of ``broadcast()`` to N actors, ms (it does not wait)
  health       first ``health()`` after the spawn (and the hub's CPU for it), then the
               median of 10, ms
  hub CPU      the hub's CPU per ``health()``, ms (psutil over those 10)
  fresh client a new interpreter: ``connect`` + ``actor_meshes[...]`` + first call, ms,
               the import of the client's modules included; each phase printed apart
  fds / RSS    open files and resident MiB of the client, the hub, and the agents (sum)
  stop         ``procs.stop()`` seconds

Prints a table per topology and writes ``scale.json`` and ``scale.png`` (curves against
N, floors dashed) to ``--out`` (default: $TMPDIR/monarch_nb_bench_scale). Runs in an isolated MONARCH_NB_HOME; exit status 1 if any
process of its clusters is left behind. See docs/scale.md for the cost model.
"""

from __future__ import annotations

from tidy import WATCH_PARENT, bare_interpreters, isolated_home, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import json  # noqa: E402
import operator  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import psutil  # noqa: E402
import zmq  # noqa: E402

import monarch_nb  # noqa: E402
from monarch_nb.protocol import router_ops  # noqa: E402

BENCH = Path(__file__).resolve().parent
MiB = 1 << 20
ROUNDS = 20
BYTECODE_OFF = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))  # a fresh client compiles what it imports

# A raw echo process of the call-all floor: one DEALER connected to the bench's ROUTER.
RAW_ECHO = WATCH_PARENT + r"""
import zmq
sock = zmq.Context().socket(zmq.DEALER)
sock.setsockopt(zmq.LINGER, 0)
sock.connect(sys.argv[1])
sock.send(b"ready")
while True:
    sock.send(sock.recv())
"""

# Runs in a fresh interpreter: connect -> handle -> first call on a retained mesh. Each
# phase is timed apart: "import" is what ``monarch_nb.connect`` imports on first use (the
# client's modules: compiled from source at every start where PYTHONDONTWRITEBYTECODE is
# set, as on this project's machines), then connect, the handle, the first call (its
# connections to every proc and theirs back), and a second call for comparison.
FRESH_CLIENT = """
import json, sys, time
import psutil
import monarch_nb
t0 = time.perf_counter()
import monarch_nb.client.cluster, monarch_nb.client.actor_mesh
t1 = time.perf_counter()
c = monarch_nb.connect(sys.argv[1])
t2 = time.perf_counter()
mesh = c.actor_meshes[sys.argv[2]]
t3 = time.perf_counter()
n = len(mesh.ping.call().get())
t4 = time.perf_counter()
mesh.ping.call().get()
t5 = time.perf_counter()
print(json.dumps({"total": t4 - t0, "import": t1 - t0, "connect": t2 - t1, "handles": t3 - t2,
                  "first_call": t4 - t3, "second_call": t5 - t4, "n": n, "fds": psutil.Process().num_fds()}))
"""


def log(text: str) -> None:
    print(text, flush=True)


def raw_fanout(n: int) -> float:
    """Median ms of one raw round: a small message from a ROUTER to each of ``n`` echo
    processes and their ``n`` replies back."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    children = [subprocess.Popen([sys.executable, "-c", RAW_ECHO, f"tcp://127.0.0.1:{port}"]) for _ in range(n)]
    try:
        peers = [router.recv_multipart()[0] for _ in range(n)]
        rounds = []
        for _ in range(ROUNDS + 2):
            started = time.perf_counter()
            for peer in peers:
                router.send_multipart([peer, b"x" * 64])
            for _ in peers:
                router.recv_multipart()
            rounds.append(time.perf_counter() - started)
        return statistics.median(rounds[2:]) * 1e3
    finally:
        for child in children:
            child.kill()
        for child in children:
            child.wait()
        router.close()
        ctx.term()


class Received:
    """Counts the messages the client's mailbox receives (a router's batch counts once)."""

    def __init__(self):
        from monarch_nb.client.runtime import runtime

        self.count = 0
        self._mailbox = runtime().mailbox

    def __enter__(self):
        dispatch = type(self._mailbox)._dispatch.__get__(self._mailbox)

        def counted(frames):
            self.count += 1
            dispatch(frames)

        self._mailbox._dispatch = counted
        return self

    def __exit__(self, *exc):
        del self._mailbox._dispatch


# How a call reaches the actors: the environment of each (MODES: name -> settings).
MODES = {"direct": {router_ops.ROUTER_ENV: router_ops.ROUTER_OFF},
         "routed": {router_ops.ROUTER_ENV: router_ops.ROUTER_ON, router_ops.RELAY_ENV: router_ops.ROUTER_OFF},
         "relayed": {router_ops.ROUTER_ENV: router_ops.ROUTER_ON, router_ops.RELAY_ENV: router_ops.ROUTER_ON}}


def call_figures(procs, mesh, n: int, mode: str) -> dict:
    """The first call to a fresh mesh of ``procs`` (ms; spawned that way too), then median
    wall ms, client CPU ms and messages received per call over all ``n`` actors of
    ``mesh``, and per ``reduce(operator.add)``; called as ``MODES[mode]`` says."""
    from bench_echo import Echo

    os.environ.update(MODES[mode])
    try:
        fresh = procs.spawn(f"echo_{mode}", Echo)
        started = time.perf_counter()
        assert len(fresh.ping.call().get()) == n
        first_ms = (time.perf_counter() - started) * 1e3
        fresh.stop().get()
        assert len(mesh.ping.call().get()) == n  # the route table is learnt here (one hub request)
        walls = []
        cpu, caller_cpu = time.process_time(), time.thread_time()
        with Received() as received:
            for _ in range(ROUNDS):
                started = time.perf_counter()
                mesh.ping.call().get()
                walls.append(time.perf_counter() - started)
        out = {"first_call_ms": first_ms, "call_ms": statistics.median(walls) * 1e3, "cpu_ms": (time.process_time() - cpu) / ROUNDS * 1e3,
               "thread_cpu_ms": (time.thread_time() - caller_cpu) / ROUNDS * 1e3, "msgs": received.count / ROUNDS}
        walls = []
        with Received() as received:
            for _ in range(ROUNDS):
                started = time.perf_counter()
                assert mesh.ping.reduce(operator.add, 1).get() == n
                walls.append(time.perf_counter() - started)
        out.update(reduce_ms=statistics.median(walls) * 1e3, reduce_msgs=received.count / ROUNDS)
        return out
    finally:
        for name in MODES[mode]:
            os.environ.pop(name, None)


def cluster_processes(path: str) -> dict[str, list[psutil.Process]]:
    """The cluster's hub and host agents (procs and forkservers are not counted here)."""
    found: dict[str, list[psutil.Process]] = {"hub": [], "agent": []}
    for p in psutil.process_iter(["cmdline"]):
        line = p.info["cmdline"] or []
        if path not in " ".join(line) or line[1:3] == ["-m", "monarch_nb.host.forkserver"]:
            continue
        text = " ".join(line)
        if "monarch_nb.hub" in text:
            found["hub"].append(p)
        elif "monarch_nb.host" in text:
            found["agent"].append(p)
    return found


def footprint(processes: list[psutil.Process]) -> tuple[int, float]:
    """Open files and resident MiB, summed over ``processes``."""
    return sum(p.num_fds() for p in processes), sum(p.memory_info().rss for p in processes) / MiB


def measure(name: str, hosts: int, per_host: int) -> dict:
    """Every monarch_nb figure for ``hosts`` x ``per_host`` procs on a fresh retained cluster."""
    sys.path.insert(0, str(BENCH))
    from bench_echo import Echo

    n = hosts * per_host
    cluster = monarch_nb.Cluster.start(name, hosts=hosts)
    row: dict = {"hosts": hosts, "procs": n}
    try:
        started = time.perf_counter()
        procs = cluster.host_mesh().spawn_procs(per_host={"gpus": per_host}, name="p")
        row["spawn_s"] = time.perf_counter() - started
        started = time.perf_counter()
        mesh = procs.spawn("echo", Echo)
        row["actors_s"] = time.perf_counter() - started
        started = time.perf_counter()
        assert len(mesh.ping.call().get()) == n
        row["first_call_ms"] = (time.perf_counter() - started) * 1e3
        found = cluster_processes(str(cluster.path))
        hub = found["hub"][0]
        cpu_before = sum(hub.cpu_times()[:2])
        started = time.perf_counter()
        cluster.health()
        row["first_health_ms"] = (time.perf_counter() - started) * 1e3
        row["first_health_hub_cpu_ms"] = (sum(hub.cpu_times()[:2]) - cpu_before) * 1e3

        calls = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            mesh.ping.call().get()
            calls.append(time.perf_counter() - started)
        row["call_all_ms"] = statistics.median(calls) * 1e3
        if hosts > 1:  # direct, then through the routers, on the same mesh
            for how in MODES:
                for key, value in call_figures(procs, mesh, n, how).items():
                    row[f"{how}_{key}"] = value
        sends = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            mesh.ping.broadcast()
            sends.append(time.perf_counter() - started)
            mesh.ping.call().get()  # the broadcast has been handled everywhere (per-actor order)
        row["broadcast_ms"] = statistics.median(sends) * 1e3

        found = cluster_processes(str(cluster.path))
        cpu_before = sum(hub.cpu_times()[:2])
        healths = []
        for _ in range(10):
            started = time.perf_counter()
            cluster.health()
            healths.append(time.perf_counter() - started)
        row["health_ms"] = statistics.median(healths) * 1e3
        row["hub_cpu_per_health_ms"] = (sum(hub.cpu_times()[:2]) - cpu_before) / 10 * 1e3

        for who, processes in (("client", [psutil.Process()]), ("hub", found["hub"]), ("agents", found["agent"])):
            row[f"{who}_fds"], row[f"{who}_rss_mib"] = footprint(processes)

        fresh = fresh_client(name)
        for key in ("total", "import", "connect", "handles", "first_call", "second_call"):
            row["fresh_client_ms" if key == "total" else f"fresh_{key}_ms"] = fresh[key] * 1e3
        if hosts > 1:  # a client whose calls go through the routers holds sockets per host
            row["direct_client_fds"] = fresh["fds"]
            row["direct_fresh_ms"] = (fresh["connect"] + fresh["handles"] + fresh["first_call"]) * 1e3
            for how in ("routed", "relayed"):
                fresh = fresh_client(name, MODES[how])
                row[f"{how}_client_fds"] = fresh["fds"]
                row[f"{how}_fresh_ms"] = (fresh["connect"] + fresh["handles"] + fresh["first_call"]) * 1e3

        started = time.perf_counter()
        procs.stop().get()
        row["stop_s"] = time.perf_counter() - started
    finally:
        row["left_behind"] = stop_and_check(cluster, None)
    return row


def fresh_client(name: str, env: dict | None = None) -> dict:
    """:data:`FRESH_CLIENT`'s figures (seconds; ``fds``: its open files at the end)."""
    out = subprocess.run([sys.executable, "-c", FRESH_CLIENT, name, "echo"], capture_output=True, text=True,
                         cwd=BENCH, timeout=300, env={**os.environ, **(env or {})})
    if out.returncode:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


COLUMNS = [("procs", "{:d}"), ("spawn_s", "{:.2f}"), ("bare_floor_s", "{:.2f}"), ("actors_s", "{:.2f}"),
           ("first_call_ms", "{:.0f}"), ("call_all_ms", "{:.2f}"), ("raw_floor_ms", "{:.2f}"),
           ("broadcast_ms", "{:.2f}"), ("first_health_ms", "{:.0f}"), ("first_health_hub_cpu_ms", "{:.0f}"),
           ("health_ms", "{:.1f}"),
           ("hub_cpu_per_health_ms", "{:.1f}"), ("fresh_client_ms", "{:.0f}"), ("client_fds", "{:d}"),
           ("hub_fds", "{:d}"), ("agents_fds", "{:d}"), ("client_rss_mib", "{:.0f}"),
           ("hub_rss_mib", "{:.0f}"), ("agents_rss_mib", "{:.0f}"), ("stop_s", "{:.2f}")]


ROUTED_COLUMNS = [("hosts", "{:d}"), ("procs", "{:d}"), ("raw_floor_ms", "{:.2f}")] + [
    (f"{how}_{key}", fmt) for how in MODES
    for key, fmt in (("first_call_ms", "{:.0f}"), ("call_ms", "{:.2f}"), ("cpu_ms", "{:.2f}"), ("thread_cpu_ms", "{:.2f}"), ("msgs", "{:.1f}"),
                     ("reduce_ms", "{:.2f}"), ("reduce_msgs", "{:.1f}"), ("client_fds", "{:d}"),
                     ("fresh_ms", "{:.0f}"))]


def table(title: str, rows: list[dict]) -> None:
    log(f"\n{title}")
    log("  ".join(name for name, _ in COLUMNS))
    for row in rows:
        log("  ".join(fmt.format(row[name]).rjust(len(name)) for name, fmt in COLUMNS))
    for row in rows:
        log(f"  {row['procs']} procs: spawn {row['spawn_s'] / row['bare_floor_s']:.2f}x bare interpreters, "
            f"call all {row['call_all_ms'] / row['raw_floor_ms']:.2f}x raw fan-out")
        log(f"  {row['procs']} procs, fresh client {row['fresh_client_ms']:.0f} ms: import "
            f"{row['fresh_import_ms']:.0f}{' (compiled: PYTHONDONTWRITEBYTECODE)' if BYTECODE_OFF else ''}, "
            f"connect {row['fresh_connect_ms']:.0f}, handles {row['fresh_handles_ms']:.0f}, "
            f"first call {row['fresh_first_call_ms']:.0f} (second {row['fresh_second_call_ms']:.0f})")
    routed = [row for row in rows if "routed_call_ms" in row]
    if routed:
        log(f"\n{title}: calls direct and through the host routers (same mesh, same run)")
        log("  ".join(name for name, _ in ROUTED_COLUMNS))
        for row in routed:
            log("  ".join(fmt.format(row[name]).rjust(len(name)) for name, fmt in ROUTED_COLUMNS))
        for row in routed:
            log(f"  {row['procs']} procs on {row['hosts']} hosts: call all direct "
                f"{row['direct_call_ms'] / row['raw_floor_ms']:.2f}x raw fan-out, routed "
                f"{row['routed_call_ms'] / row['raw_floor_ms']:.2f}x, relayed "
                f"{row['relayed_call_ms'] / row['raw_floor_ms']:.2f}x; client CPU per call routed / direct "
                f"{row['routed_cpu_ms'] / row['direct_cpu_ms']:.2f}, relayed / direct "
                f"{row['relayed_cpu_ms'] / row['direct_cpu_ms']:.2f}")


def plot(results: dict, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("(no matplotlib: no plot)")
        return False
    panels = [("spawn_s", "bare_floor_s", "spawn_procs (s)"), ("call_all_ms", "raw_floor_ms", "call all (ms)"),
              ("first_health_ms", None, "first health() (ms)"), ("health_ms", None, "health() (ms)"),
              ("fresh_client_ms", None, "fresh client to first call (ms)"),
              ("hub_cpu_per_health_ms", None, "hub CPU per health() (ms)")]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (key, floor, title) in zip(axes.flat, panels):
        for topology, rows in results.items():
            if not rows:
                continue
            xs = [r["procs"] for r in rows]
            line, = ax.plot(xs, [r[key] for r in rows], marker="o", label=topology)
            if floor:
                ax.plot(xs, [r[floor] for r in rows], linestyle="--", color=line.get_color(),
                        label=f"{topology}: floor")
        ax.set_title(title)
        ax.set_xlabel("procs")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="*", default=[8, 32, 128], help="procs on one host")
    parser.add_argument("--hosts", type=int, nargs="*", default=[1, 4, 16], help="local hosts of 8 procs")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "monarch_nb_bench_scale")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log(f"monarch_nb scale bench: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
        f"MONARCH_NB_HOME={os.environ['MONARCH_NB_HOME']}")
    results: dict[str, list[dict]] = {"one host": [], "hosts x 8": []}
    left = 0
    try:
        for topology, shapes in (("one host", [(1, n) for n in args.sizes]),
                                 ("hosts x 8", [(h, 8) for h in args.hosts])):
            for i, (hosts, per_host) in enumerate(shapes):
                n = hosts * per_host
                log(f"{topology}: {hosts} host(s) x {per_host} procs ...")
                row = measure(f"scale{len(results[topology])}{topology[0]}{i}", hosts, per_host)
                row["bare_floor_s"] = bare_interpreters(n)
                row["raw_floor_ms"] = raw_fanout(n)
                left |= row.pop("left_behind")
                results[topology].append(row)
        for topology, rows in results.items():
            if rows:
                table(topology, rows)
    finally:
        (args.out / "scale.json").write_text(json.dumps(results, indent=1))
        if plot(results, args.out / "scale.png"):
            log(f"\nwrote {args.out / 'scale.json'} and {args.out / 'scale.png'}")
        if _OWN_HOME:
            import shutil
            shutil.rmtree(_OWN_HOME, ignore_errors=True)
    return left


if __name__ == "__main__":
    sys.exit(main())
