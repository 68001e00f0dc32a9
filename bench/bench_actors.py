"""monarch_nb actor benchmark: every figure next to a baseline measured in the same run.

    cd /work/main && .venv/bin/python bench/bench_actors.py [--quick]

Figures (see bench/README.md):
  1. floor      raw pyzmq DEALER/ROUTER + cloudpickle echo between two processes
  2. call_one   echo.ping.call_one(x).get() on one actor in one proc
  3. call x8    echo.ping.call(x).get() over 8 actors in 8 procs
  4. spawn      spawn_procs(per_host={"gpus": 8}) and procs.spawn(...) on them
  5. tensors    one-way throughput of 64 MiB torch tensors client -> actor, next to
                memcpy, raw zmq and HMAC-SHA256 throughput (every frame is signed)

Latencies are measured in interleaved blocks (baseline block, monarch_nb block, ...)
so that both sides see the same machine state: on a small VM the round trip of even
the raw floor moves between ~0.05 and ~0.15 ms depending on where the scheduler puts
the threads involved.

Runs in an isolated MONARCH_NB_HOME (a temp dir unless already set) and checks that no
process it started is left behind; exit status 1 if one is.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

if not os.environ.get("MONARCH_NB_HOME"):
    _OWN_HOME = tempfile.mkdtemp(prefix="monarch_nb_bench_")
    os.environ["MONARCH_NB_HOME"] = _OWN_HOME
    # Registered before anything else: runs last, after the cluster's own atexit stop.
    atexit.register(shutil.rmtree, _OWN_HOME, ignore_errors=True)

import argparse  # noqa: E402
import hashlib  # noqa: E402
import hmac  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import cloudpickle  # noqa: E402
import zmq  # noqa: E402
import tidy  # noqa: E402  (beside this script)

from monarch_nb.actor import Actor, endpoint, this_host  # noqa: E402

MiB = 1 << 20
SMALL_ARG = {"step": 1, "tag": "ping", "xs": [1.0, 2.0, 3.0]}  # a typical small argument

# ---------------------------------------------------------------------------------------
# helpers


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def summary(samples_s: list[float]) -> tuple[float, float]:
    """(median, p99) in milliseconds."""
    return statistics.median(samples_s) * 1e3, pct(samples_s, 0.99) * 1e3


def timed_loop(fn, warmup: int, iters: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    clock = time.perf_counter
    for _ in range(iters):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def interleaved(fns: dict, total: int, blocks: int, warmup: int) -> dict[str, list[float]]:
    """Run each of ``fns`` ``total`` times, in ``blocks`` alternating blocks; returns
    the per-call seconds of each."""
    for fn in fns.values():
        timed_loop(fn, warmup, 0)
    out: dict[str, list[float]] = {name: [] for name in fns}
    per_block = max(1, total // blocks)
    for _ in range(blocks):
        for name, fn in fns.items():
            out[name].extend(timed_loop(fn, 5, per_block))
    return out


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------
# the floor: raw pyzmq DEALER/ROUTER + cloudpickle echo servers, one process each

_ECHO_SERVER = tidy.RAW_SERVER_PRELUDE + r"""
while True:
    frames = sock.recv_multipart(copy=False)
    ident = frames[0].bytes
    if len(frames) == 3:  # [ident, b"sink", buffer]: reply with the byte count only
        sock.send_multipart([ident, b"%d" % len(frames[2])])
        continue
    value = cloudpickle.loads(frames[1].bytes)
    if value == "__exit__":
        sock.send_multipart([ident, cloudpickle.dumps(None)])
        break
    sock.send_multipart([ident, cloudpickle.dumps(value)])
sock.close(0); ctx.term()
"""


class RawEchoServers:
    """``n`` raw pyzmq ROUTER echo servers, each in its own process, and a DEALER to each."""

    def __init__(self, n: int):
        self.servers = [subprocess.Popen([sys.executable, "-c", _ECHO_SERVER], stdout=subprocess.PIPE,
                                         stdin=subprocess.DEVNULL) for _ in range(n)]
        self.ctx = zmq.Context()
        self.socks = []
        for server in self.servers:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://127.0.0.1:{int(server.stdout.readline())}")
            self.socks.append(sock)

    def echo(self, value):
        """Pickle ``value`` once, send it to every server, gather and unpickle every reply
        (the work ``call`` does, minus signing and routing)."""
        payload = cloudpickle.dumps(((value,), {}))
        for sock in self.socks:
            sock.send(payload)
        return [cloudpickle.loads(sock.recv()) for sock in self.socks]

    def sink(self, buffer, count: int = 1) -> None:
        """Send ``buffer`` ``count`` times zero-copy to server 0, then wait for every reply."""
        sock = self.socks[0]
        for _ in range(count):
            sock.send_multipart([b"sink", buffer], copy=False)
        for _ in range(count):
            sock.recv()

    def alive(self) -> list[int]:
        return [s.pid for s in self.servers if s.poll() is None]

    def close(self) -> None:
        if self.ctx.closed:
            return
        for sock in self.socks:
            try:
                sock.send(cloudpickle.dumps("__exit__"), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        for server, sock in zip(self.servers, self.socks):
            try:
                server.wait(5)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            server.stdout.close()
            sock.close(0)
        self.ctx.term()


# ---------------------------------------------------------------------------------------
# the actor


class Echo(Actor):
    @endpoint
    def ping(self, x):
        return x

    @endpoint
    def take(self, tensor):
        # Touch the data (first and last element) but send back only a small value.
        return int(tensor.numel()) + int(tensor[0]) + int(tensor[-1])


# ---------------------------------------------------------------------------------------
# throughput baselines


def memcpy_gbps(nbytes: int, reps: int) -> tuple[float, float]:
    """(numpy copy into a preallocated buffer, torch.clone into fresh memory) in GB/s."""
    import numpy as np
    import torch

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    np_s = timed_loop(lambda: np.copyto(dst, src), 0, reps)
    ts = torch.ones(nbytes // 4, dtype=torch.float32)
    clone_s = timed_loop(lambda: ts.clone(), 1, reps)
    return nbytes / statistics.median(np_s) / 1e9, nbytes / statistics.median(clone_s) / 1e9


def hmac_gbps(nbytes: int, reps: int) -> float:
    data = memoryview(os.urandom(1 << 16) * (nbytes >> 16))
    key = os.urandom(32)
    s = timed_loop(lambda: hmac.new(key, data, hashlib.sha256).digest(), 1, reps)
    return nbytes / statistics.median(s) / 1e9


# ---------------------------------------------------------------------------------------
# leftover check


def leftover_processes(marker: str) -> list[str]:
    """Processes (other than this one) whose command line mentions ``marker``: the hub,
    host agent and procs all get ``--cluster-dir`` under MONARCH_NB_HOME."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            found.append(f"{pid}: {cmd.strip()}")
    return found


# ---------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    args = parser.parse_args()
    q = 0.1 if args.quick else 1.0
    n_one = max(200, int(2000 * q))
    n_eight = max(100, int(1000 * q))
    blocks = 4 if args.quick else 10
    n_spawn = 2 if args.quick else 3
    n_tensor = 4 if args.quick else 10
    tensor_bytes = 64 * MiB

    import numpy as np

    home = os.environ["MONARCH_NB_HOME"]
    log(f"monarch_nb bench: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, "
        f"pyzmq {zmq.__version__} (libzmq {zmq.zmq_version()}), MONARCH_NB_HOME={home}")
    started = time.perf_counter()
    rows = []  # (figure, value, baseline, ratio, target, met)
    raw_servers: list[RawEchoServers] = []

    # throughput baselines, before anything else runs --------------------------------
    np_gbps, clone_gbps = memcpy_gbps(tensor_bytes, reps=10)
    mac_gbps = hmac_gbps(tensor_bytes, reps=5)
    raw1 = RawEchoServers(1)
    raw_servers.append(raw1)
    raw_buf = np.ones(tensor_bytes, dtype=np.uint8)
    raw1.sink(raw_buf, 2)  # warm-up
    raw_seq = timed_loop(lambda: raw1.sink(raw_buf), 0, n_tensor)
    t0 = time.perf_counter()
    raw1.sink(raw_buf, n_tensor)
    raw_pipe_gbps = n_tensor * tensor_bytes / (time.perf_counter() - t0) / 1e9
    raw_seq_gbps = tensor_bytes / statistics.median(raw_seq) / 1e9
    raw_buf = None  # free the 64 MiB
    log(f"[0] 64 MiB baselines: memcpy (numpy copyto) {np_gbps:.2f} GB/s, torch.clone (fresh memory) "
        f"{clone_gbps:.2f} GB/s, HMAC-SHA256 {mac_gbps:.3f} GB/s, raw zmq zero-copy send to another "
        f"process {raw_seq_gbps:.3f} GB/s one at a time / {raw_pipe_gbps:.3f} GB/s {n_tensor} pipelined")

    cluster = None
    try:
        cluster_started = time.perf_counter()
        host = this_host()
        from monarch_nb.client.cluster import default_cluster

        cluster = default_cluster()
        log(f"    ephemeral cluster up in {time.perf_counter() - cluster_started:.2f} s")

        # 1 + 2. floor and call_one, interleaved ---------------------------------------
        procs1 = host.spawn_procs(per_host={"gpus": 1}, name="bench_one")
        echo = procs1.spawn("echo", Echo)
        got = interleaved({"floor": lambda: raw1.echo(SMALL_ARG),
                           "call_one": lambda: echo.ping.call_one(SMALL_ARG).get()},
                          total=n_one, blocks=blocks, warmup=200)
        floor_a = got["floor"]
        one = got["call_one"]

        # 3. call over 8 actors in 8 procs, interleaved with the floors ------------------
        procs8 = host.spawn_procs(per_host={"gpus": 8}, name="bench_eight")
        echo8 = procs8.spawn("echo8", Echo)
        raw8 = RawEchoServers(8)
        raw_servers.append(raw8)
        got = interleaved({"floor": lambda: raw1.echo(SMALL_ARG),
                           "floor8": lambda: raw8.echo(SMALL_ARG),
                           "call8": lambda: echo8.ping.call(SMALL_ARG).get()},
                          total=n_eight, blocks=blocks, warmup=50)
        raw8.close()
        procs8.stop()
        # The floor is one figure: every floor block of both phases.
        floor_b = got["floor"]
        floor_med, floor_p99 = summary(floor_a + floor_b)
        one_med, one_p99 = summary(one)
        floor8_med, floor8_p99 = summary(got["floor8"])
        eight_med, eight_p99 = summary(got["call8"])
        log(f"[1] floor: raw zmq DEALER/ROUTER + cloudpickle echo to 1 process: median {floor_med:.3f} ms, "
            f"p99 {floor_p99:.3f} ms  (n={len(floor_a) + len(floor_b)}; median {summary(floor_a)[0]:.3f} ms "
            f"next to [2], {summary(floor_b)[0]:.3f} ms next to [3])")
        r = one_med / floor_med
        log(f"[2] call_one, small arg, 1 actor in 1 proc: median {one_med:.3f} ms, p99 {one_p99:.3f} ms, "
            f"{r:.2f}x floor  (n={len(one)}, interleaved with the floor in {blocks} blocks)")
        rows.append(("call_one median (ms)", one_med, floor_med, r, "<= 1.5x", r <= 1.5))
        rows.append(("call_one p99 (ms)", one_p99, floor_p99, one_p99 / floor_p99, "-", None))
        r = eight_med / floor_med
        log(f"[3] call, small arg, 8 actors in 8 procs: median {eight_med:.3f} ms, p99 {eight_p99:.3f} ms, "
            f"{r:.2f}x floor;  floor x8 (the same raw echo to 8 processes at once, gathered): median "
            f"{floor8_med:.3f} ms, p99 {floor8_p99:.3f} ms, call is {eight_med / floor8_med:.2f}x that  "
            f"(n={len(got['call8'])}, interleaved; {os.cpu_count()} cores shared by the client and 8 procs)")
        rows.append(("call x8 median (ms)", eight_med, floor_med, r, "<= 2x", r <= 2.0))
        rows.append(("call x8 p99 (ms)", eight_p99, floor_p99, eight_p99 / floor_p99, "-", None))
        rows.append(("call x8 median vs floor x8", eight_med, floor8_med, eight_med / floor8_med, "-", None))

        # 4. spawn ------------------------------------------------------------------------
        spawn_procs_s, spawn_actors_s, stop_s = [], [], []
        for i in range(n_spawn):
            t0 = time.perf_counter()
            pm = host.spawn_procs(per_host={"gpus": 8}, name=f"bench_spawn{i}")
            t1 = time.perf_counter()
            pm.spawn(f"bench_spawn_echo{i}", Echo)
            t2 = time.perf_counter()
            pm.stop()
            t3 = time.perf_counter()
            spawn_procs_s.append(t1 - t0)
            spawn_actors_s.append(t2 - t1)
            stop_s.append(t3 - t2)
        sp_med = statistics.median(spawn_procs_s)
        sa_med = statistics.median(spawn_actors_s)
        log("[4] spawn_procs(gpus=8): " + ", ".join(f"{s:.3f}" for s in spawn_procs_s)
            + f" s (median {sp_med:.3f});  spawn an actor mesh on them: "
            + ", ".join(f"{s:.3f}" for s in spawn_actors_s) + f" s (median {sa_med:.3f});  stop: "
            + ", ".join(f"{s:.3f}" for s in stop_s) + " s")
        rows.append(("spawn 8 procs (s)", sp_med, 0.8, sp_med / 0.8, "<= 0.8 s", sp_med <= 0.8))
        rows.append(("spawn actor mesh on 8 (s)", sa_med, None, None, "-", None))

        # 5. tensors ----------------------------------------------------------------------
        import torch

        tensor = torch.ones(tensor_bytes // 4, dtype=torch.float32)
        expected = tensor.numel() + 2
        for _ in range(2):  # warm-up: the first call imports torch in the proc
            assert echo.take.call_one(tensor).get() == expected
        # one at a time: each call waits for its (tiny) reply
        seq = timed_loop(lambda: echo.take.call_one(tensor).get(), 0, n_tensor)
        seq_gbps = tensor_bytes / statistics.median(seq) / 1e9
        # pipelined: n_tensor calls sent back to back, then wait for every reply
        t0 = time.perf_counter()
        futures = [echo.take.call_one(tensor) for _ in range(n_tensor)]
        assert all(f.get() == expected for f in futures)
        pipe_gbps = n_tensor * tensor_bytes / (time.perf_counter() - t0) / 1e9
        best = max(seq_gbps, pipe_gbps)
        r = best / np_gbps
        log(f"[5] 64 MiB tensor client->actor: {seq_gbps:.3f} GB/s one at a time (median of {n_tensor}), "
            f"{pipe_gbps:.3f} GB/s {n_tensor} pipelined;  best is {r:.3f}x memcpy, {best / mac_gbps:.2f}x "
            f"HMAC-SHA256 (signed by the sender, verified by the receiver); "
            f"{seq_gbps / raw_seq_gbps:.2f}x / {pipe_gbps / raw_pipe_gbps:.2f}x raw zmq")
        rows.append(("tensor one at a time (GB/s)", seq_gbps, np_gbps, seq_gbps / np_gbps, "-", None))
        rows.append(("tensor pipelined (GB/s)", pipe_gbps, np_gbps, pipe_gbps / np_gbps, "-", None))
        rows.append(("tensor best vs memcpy (GB/s)", best, np_gbps, r, ">= 0.5x", r >= 0.5))
        rows.append(("tensor best vs raw zmq (GB/s)", best, max(raw_seq_gbps, raw_pipe_gbps),
                     best / max(raw_seq_gbps, raw_pipe_gbps), "-", None))
        rows.append(("tensor best vs HMAC (GB/s)", best, mac_gbps, best / mac_gbps, "-", None))
        rows.append(("HMAC-SHA256 vs memcpy (GB/s)", mac_gbps, np_gbps, mac_gbps / np_gbps, "-", None))
        procs1.stop()
    finally:
        for raw in raw_servers:
            raw.close()
        stop_cluster_s = None
        if cluster is not None:
            t0 = time.perf_counter()
            cluster.stop()
            stop_cluster_s = time.perf_counter() - t0

    leftovers = leftover_processes(home) + [f"{pid}: raw echo server" for raw in raw_servers for pid in raw.alive()]
    total = time.perf_counter() - started
    log(f"    cluster stopped in {stop_cluster_s:.2f} s; leftover processes: {len(leftovers)}; "
        f"total bench time {total:.1f} s")
    for line in leftovers:
        log(f"    LEFTOVER {line}")

    # table ----------------------------------------------------------------------------
    def fmt(v):
        if v is None:
            return "-"
        return f"{v:.3f}" if v < 100 else f"{v:.0f}"

    header = ("figure", "value", "baseline", "ratio", "target", "result")
    table = [header] + [
        (name, fmt(v), fmt(b), "-" if rt is None else f"{rt:.2f}x", tgt,
         "-" if met is None else ("met" if met else "MISSED"))
        for name, v, b, rt, tgt, met in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    log("")
    for k, row in enumerate(table):
        log("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
        if k == 0:
            log("  ".join("-" * w for w in widths))
    log("baselines: floor = raw zmq DEALER/ROUTER + cloudpickle echo to 1 process (floor x8: to 8), "
        "measured interleaved with the calls; spawn = the 0.8 s target; tensors = numpy memcpy, "
        "raw zmq zero-copy send and HMAC-SHA256 of 64 MiB")
    if (os.cpu_count() or 0) < 10:
        log(f"note: {os.cpu_count()} cores: the client, hub, host agent and 8 procs (or 8 echo servers) "
            "compete for CPU in [3] and [4]")
    return 1 if leftovers else 0


if __name__ == "__main__":
    sys.exit(main())
