"""Log benchmark: how fast proc output reaches the hub's store, and how long a printed
line takes to show at the client, next to baselines measured in the same run.

    .venv/bin/python bench/bench_logs.py [--quick] [--store-lines N] [--store-only]

Figures (see bench/README.md):
  1. throughput   8 procs print N lines each flat out; lines/s from the call until
                  every line is in the store (and forwarded to this client). Baseline:
                  8 plain subprocesses printing the same lines into pipes read by this
                  process (what the OS and Python do with no monarch_nb in the way).
  2. latency      one actor prints a line stamped with time.time(); the time until the
                  line reaches this client's sink, median and p99, with folding on
                  (lines wait up to the fold window for identical lines of other ranks)
                  and off. Baseline: the call's own round trip.
  3. blocking     how long the printing endpoint itself ran (the actor is blocked only
                  while its writes wait for pipe space).
  4. store        the hub's log store alone (no cluster): lines/s into a store of N lines
                  (default 5 million) until all are on disk, its size, then, opened again
                  as a recovered hub does (nothing in memory), `tail 50`, the last 50
                  lines of one rare mesh, and a follow poll (the lines after a seq).
                  Baseline: the store this one replaced (the JSON-lines file of the last
                  commit that had it, loaded from git), same lines, same run.

Runs in an isolated MONARCH_NB_HOME (a temp dir unless already set) and checks that no
process it started is left behind; exit status 1 if one is.
"""

from __future__ import annotations

from tidy import isolated_home, module_from_git, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from monarch_nb.actor import Actor, current_rank, endpoint, this_host  # noqa: E402
from monarch_nb.client.runtime import runtime  # noqa: E402
from monarch_nb.hub import logstore  # noqa: E402


class Talker(Actor):
    @endpoint
    def flood(self, n: int) -> float:
        rank = current_rank().rank
        t0 = time.perf_counter()
        for i in range(n):
            print(f"rank {rank} line {i} of the flood")
        return time.perf_counter() - t0

    @endpoint
    def stamp(self) -> None:
        print(f"stamp {time.time():.6f}")


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def pipe_baseline(procs: int, lines: int) -> float:
    """lines/s: ``procs`` subprocesses printing ``lines`` lines each into pipes."""
    code = f"import sys\nfor i in range({lines}): print(f'rank 0 line {{i}} of the flood')"
    t0 = time.perf_counter()
    children = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) for _ in range(procs)]
    readers = [threading.Thread(target=lambda c=c: sum(1 for _ in c.stdout)) for c in children]
    for r in readers:
        r.start()
    for r in readers:
        r.join()
    for c in children:
        c.wait()
    return procs * lines / (time.perf_counter() - t0)


class Stamps:
    """A sink recording when stamped lines arrive."""

    def __init__(self):
        self.latencies: list[float] = []
        self.count = 0
        self.lock = threading.Lock()

    def __call__(self, lines):
        now = time.time()
        with self.lock:
            for line in lines:
                self.count += len(line.ranks) or 1
                if line.text.startswith("stamp "):
                    self.latencies.append(now - float(line.text.split()[1]))


def jsonl_store_module():
    """The log store as it was before sqlite (``logs/lines.jsonl``), from git history."""
    return module_from_git("monarch_nb/hub/logstore.py", lambda source: "lines.jsonl" in source)


def store_bench(store_class, n: int, label: str) -> None:
    """[4] for one store class: ingest, then queries on the store reopened."""
    folder = tempfile.mkdtemp(prefix="monarch_nb_bench_store_")
    try:
        from pathlib import Path

        path = Path(folder)
        batch = 10_000
        now = time.time()
        store = store_class(path)
        t0 = time.perf_counter()
        for start in range(0, n, batch):
            # 1 line in 10,000 from a rare mesh; the rest from 8 ranks of the trainers.
            store.add("host0", [(now, "rare/0" if (start + i) % 10_000 == 0 else f"trainers/{i % 8}", "stdout",
                                 None, None, None, f"rank {i % 8} step {start + i} loss 0.{i % 97:02d}", 32)
                                for i in range(batch)])
        store.close(timeout=3600)
        ingest = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in (path / "logs").iterdir())
        store = store_class(path)  # as a recovered hub opens it: nothing in memory
        timings = {}
        for what, kwargs in (("tail 50", {"tail": 50}), ("tail 50 of a rare mesh", {"mesh": "rare", "tail": 50}),
                             ("follow poll", {"after_seq": n - 100})):
            t = time.perf_counter()
            found = store.query(**kwargs)
            timings[what] = (time.perf_counter() - t, len(found))
        store.close()
        shown = ", ".join(f"{what} {sec * 1e3:,.1f} ms ({count} lines)" for what, (sec, count) in timings.items())
        print(f"[4] store {label}: {n:,} lines in {ingest:.1f} s = {n / ingest:,.0f} lines/s to disk, "
              f"{size / 2**20:,.0f} MiB; reopened: {shown}", flush=True)
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer lines and samples")
    parser.add_argument("--store-lines", type=int, default=None,
                        help="lines in the store of [4] (default 5,000,000; --quick: 500,000)")
    parser.add_argument("--store-only", action="store_true", help="run [4] only")
    args = parser.parse_args()
    store_lines = args.store_lines or (500_000 if args.quick else 5_000_000)
    jsonl, commit = jsonl_store_module()
    big = 2 * store_lines * 200  # retention out of the way: bytes enough for every line
    store_bench(lambda p: logstore.LogStore(p, max_bytes=big, max_age_s=1e9), store_lines, "sqlite (this one)")
    store_bench(jsonl.LogStore, store_lines, f"JSON lines (baseline, {commit})")
    if args.store_only:
        return 0
    lines = 10_000 if args.quick else 50_000
    samples = 50 if args.quick else 200
    print(f"monarch_nb log bench: {os.cpu_count()} CPUs, MONARCH_NB_HOME={os.environ['MONARCH_NB_HOME']}",
          flush=True)
    base = pipe_baseline(8, lines)

    procs = this_host().spawn_procs(per_host={"gpus": 8})
    cluster = runtime().cluster
    sink = Stamps()
    runtime().set_line_sink(sink)
    try:
        talkers = procs.spawn("talkers", Talker)
        t0 = time.perf_counter()
        blocked = talkers.flood.call(lines).get().values()
        assert cluster.flush_logs(timeout=120)
        elapsed = time.perf_counter() - t0
        stored = len(cluster.logs(mesh="talkers", grep="of the flood$"))
        total = 8 * lines
        print(f"[1] throughput: {total:,} lines from 8 procs in {elapsed:.2f} s = {total / elapsed:,.0f} lines/s "
              f"into the store and to this client ({stored:,} stored, {sink.count:,} shown); baseline 8 "
              f"processes into plain pipes {base:,.0f} lines/s; ratio {total / elapsed / base:.2f}", flush=True)
        print(f"[3] blocking: the printing endpoint ran {statistics.median(blocked):.2f} s median "
              f"({lines:,} lines, {lines / statistics.median(blocked):,.0f} lines/s per actor)", flush=True)

        one = talkers.slice(gpus=0)
        rtt = []
        for fold in (True, False):
            runtime().lines.folder.enabled = fold
            sink.latencies.clear()
            for _ in range(samples):
                t = time.perf_counter()
                one.stamp.call_one().get()
                rtt.append(time.perf_counter() - t)
                deadline = time.monotonic() + 5
                while len(sink.latencies) < _ + 1 and time.monotonic() < deadline:
                    time.sleep(0.0005)  # the benchmark waits on its own sink to measure one line at a time
            lat = sink.latencies
            print(f"[2] latency print -> client, folding {'on ' if fold else 'off'}: median "
                  f"{statistics.median(lat) * 1e3:.1f} ms, p99 {pct(lat, 0.99) * 1e3:.1f} ms (n={len(lat)}); "
                  f"the call's round trip {statistics.median(rtt) * 1e3:.2f} ms", flush=True)
        runtime().lines.folder.enabled = True
    finally:
        runtime().set_line_sink(None)
        status = stop_and_check(cluster, _OWN_HOME)
    return status


if __name__ == "__main__":
    sys.exit(main())
