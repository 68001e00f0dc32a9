"""Reconnect benchmark: from a fresh client to the first successful call on a retained
mesh, next to what a client without retained clusters must do (respawn), measured in
the same run.

    .venv/bin/python bench/bench_reconnect.py [--quick]

Figures (see bench/README.md):
  1. reconnect, 8 procs     a fresh process: connect() -> actor_meshes[...] -> call().get()
                            on a retained mesh of 8 actors in 8 procs; baseline: the same
                            fresh process spawning 8 procs and 8 actors, then calling
                            (Monarch's reconnect: hosts kept, procs and actors respawned)
  2. kernel                 the same connect + first call inside a real Jupyter kernel,
                            timed in the kernel, and the wall time of
                            KernelManager.restart_kernel + that cell
  3. registry of 64 procs / 1,024 actors   figure 1 again with 16 actor meshes of 64
                            actors over 64 procs in the registry: first call on 8 of them
                            and on all 64 of one mesh

Runs in an isolated MONARCH_NB_HOME (a temp dir unless already set); exit status 1 if
any process of the clusters it started is left behind.
"""

from __future__ import annotations

from tidy import isolated_home, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import os  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402


import monarch_nb  # noqa: E402

BENCH = Path(__file__).resolve().parent

# Runs in a fresh interpreter: times connect -> handle -> first call, after imports.
RECONNECT = """
import json, sys, time
t_import = time.perf_counter()
import monarch_nb
from monarch_nb.actor import this_host
t0 = time.perf_counter()
c = monarch_nb.connect(sys.argv[1])
t1 = time.perf_counter()
mesh = c.actor_meshes[sys.argv[2]]
if int(sys.argv[3]):
    mesh = mesh.slice(gpus=slice(0, int(sys.argv[3])))
t2 = time.perf_counter()
n = len(mesh.ping.call().get())
t3 = time.perf_counter()
print(json.dumps({"import": t0 - t_import, "connect": t1 - t0, "handles": t2 - t1, "call": t3 - t2,
                  "total": t3 - t0, "n": n}))
"""

# The baseline: respawn what the retained cluster keeps, then call.
RESPAWN = """
import json, sys, time
import monarch_nb
from monarch_nb.actor import this_host
from bench_echo import Echo
c = monarch_nb.connect(sys.argv[1])
t0 = time.perf_counter()
procs = this_host().spawn_procs(per_host={"gpus": 8}, name=sys.argv[2])
mesh = procs.spawn(sys.argv[2], Echo)
n = len(mesh.ping.call().get())
t1 = time.perf_counter()
procs.stop()
print(json.dumps({"total": t1 - t0, "n": n}))
"""


def fresh(script: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=BENCH,
                         timeout=300)
    if out.returncode:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_of(results: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in results)


def log(text: str) -> None:
    print(text, flush=True)


def reconnect_rows(name: str, mesh: str, reps: int, first: int = 0) -> list[dict]:
    return [fresh(RECONNECT, name, mesh, str(first)) for _ in range(reps)]


def kernel_figure(name: str, reps: int) -> tuple[float, float]:
    sys.path.insert(0, str(BENCH.parent / "tests"))
    from kernels import Kernel

    cell = ("import time, monarch_nb\nt0 = time.perf_counter()\nc = monarch_nb.connect({name!r})\n"
            "n = len(c.actor_meshes['echo'].ping.call().get())\nprint(time.perf_counter() - t0)")
    kernel = Kernel()
    inside, walls = [], []
    try:
        kernel.run("import monarch_nb.actor")  # the first cell of a notebook imports
        for _ in range(reps):
            t0 = time.perf_counter()
            kernel.restart()
            kernel.run("import monarch_nb.actor")
            inside.append(float(kernel.run(cell.format(name=name))))
            walls.append(time.perf_counter() - t0)
    finally:
        kernel.shutdown()
    return statistics.median(inside), statistics.median(walls)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, no 64-proc registry")
    args = parser.parse_args()
    reps = 3 if args.quick else 7
    sys.path.insert(0, str(BENCH))
    from bench_echo import Echo

    log(f"monarch_nb reconnect bench: {os.cpu_count()} CPUs, MONARCH_NB_HOME={os.environ['MONARCH_NB_HOME']}")
    cluster = monarch_nb.Cluster.start("bench")
    try:
        procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 8}, name="p8")
        procs.spawn("echo", Echo).ping.call().get()
        cluster.disconnect()

        small = reconnect_rows("bench", "echo", reps)
        respawn = [fresh(RESPAWN, "bench", f"respawn{i}") for i in range(reps)]
        ours, base = median_of(small, "total"), median_of(respawn, "total")
        log(f"[1] reconnect to 8 procs: connect {median_of(small, 'connect') * 1e3:.1f} ms + handles "
            f"{median_of(small, 'handles') * 1e3:.1f} ms + first call {median_of(small, 'call') * 1e3:.1f} ms "
            f"= {ours * 1e3:.1f} ms (import before it: {median_of(small, 'import') * 1e3:.0f} ms); "
            f"respawn baseline {base * 1e3:.0f} ms; ratio {ours / base:.3f}; target <= 500 ms: "
            f"{'met' if ours <= 0.5 else 'MISSED'}")

        inside, wall = kernel_figure("bench", max(2, reps // 2))
        log(f"[2] kernel: connect + first call timed in the kernel {inside * 1e3:.1f} ms; restart_kernel + "
            f"import + that cell {wall:.2f} s wall; target (connect to live actors) <= 300 ms: "
            f"{'met' if inside <= 0.3 else 'MISSED'}")

        if not args.quick:
            t0 = time.perf_counter()
            big = cluster.host_mesh().spawn_procs(per_host={"gpus": 64}, name="p64")
            spawned = time.perf_counter() - t0
            t0 = time.perf_counter()
            for i in range(16):
                big.spawn(f"echo64_{i}", Echo)
            actors = time.perf_counter() - t0
            info_bytes = len(json.dumps(cluster.info()))
            log(f"    registry: 64 procs in {spawned:.2f} s, 16 x 64 = 1024 actors in {actors:.2f} s, "
                f"hub info {info_bytes / 1024:.0f} KiB")
            eight = reconnect_rows("bench", "echo64_0", reps, first=8)
            all64 = reconnect_rows("bench", "echo64_0", reps)
            small_again = reconnect_rows("bench", "echo", reps)
            log(f"[3] registry of 72 procs / 1,032 actors: connect {median_of(eight, 'connect') * 1e3:.1f} ms "
                f"+ handles {median_of(eight, 'handles') * 1e3:.1f} ms; first call to 8 of a 64-actor mesh "
                f"{median_of(eight, 'call') * 1e3:.1f} ms (total {median_of(eight, 'total') * 1e3:.1f} ms), "
                f"to all 64 {median_of(all64, 'call') * 1e3:.1f} ms (total "
                f"{median_of(all64, 'total') * 1e3:.1f} ms); the 8-proc mesh again "
                f"{median_of(small_again, 'total') * 1e3:.1f} ms = "
                f"{median_of(small_again, 'total') / ours:.2f}x figure 1")
    finally:
        status = stop_and_check(cluster, _OWN_HOME)
    return status


if __name__ == "__main__":
    sys.exit(main())
