"""A breakpoint set by name after a kernel restart: from ``%monarch break`` to the rank
listed as paused (ms), next to the same in the kernel that spawned the actors (same run).

    .venv/bin/python bench/bench_break_after_restart.py [--reps N]

A kernel (jupyter_client) defines ``Worker`` in a cell and spawns it on 4 procs of a
retained cluster. Each round, timed inside the kernel: ``%monarch break
Worker.compute w --ranks 2``, a call, ``wait_paused(1)``; then continue and clear. First
in that kernel, then after a kernel restart and the class cell run again (the actors
still run the old kernel's code). Runs in its own MONARCH_NB_HOME; exit status 1 if a
process is left behind.
"""

from __future__ import annotations

from tidy import isolated_home, ms_row, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
from pathlib import Path  # noqa: E402

import monarch_nb  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from kernels import WORKER, Kernel  # noqa: E402

ROUND = textwrap.dedent("""\
    import time, monarch_nb
    c = monarch_nb.connect("bench")
    t0 = time.perf_counter()
    get_ipython().run_line_magic("monarch", "break Worker.compute w --ranks 2")
    fut = c.actor_meshes["w"].compute.call(1)
    c.debugger.wait_paused(1, "w", timeout=60)
    took = time.perf_counter() - t0
    c.debugger.continue_all()
    fut.get(timeout=60)
    c.debugger.clear_breakpoints()
    print(took)
    """)


def rounds(kernel: Kernel, reps: int) -> list[float]:
    return [float(kernel.run(ROUND).strip().splitlines()[-1]) for _ in range(reps)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    cluster = monarch_nb.Cluster.start("bench")
    kernel = Kernel("python3")
    try:
        kernel.run("%load_ext monarch_nb\n%monarch connect bench")
        kernel.run(WORKER)
        kernel.run("%monarch procs wprocs --per-host gpus=4\n%monarch spawn w Worker --procs wprocs")
        same = rounds(kernel, args.reps)
        kernel.restart()
        kernel.run("%load_ext monarch_nb\n%monarch connect bench")
        kernel.run(WORKER)
        after = rounds(kernel, args.reps)
        print(f"%monarch break Worker.compute w --ranks 2 -> rank listed paused, median of {args.reps}:")
        for name, values in (("same kernel", same), ("after a kernel restart", after)):
            print(ms_row(name, values, width=24))
    finally:
        kernel.shutdown()
    return stop_and_check(cluster, _OWN_HOME)


if __name__ == "__main__":
    sys.exit(main())
