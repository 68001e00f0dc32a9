"""Ctrl-C in a notebook cell that waits on a call: how long until the next call is
answered, with the interrupt reaching the ranks (the default) and without
(``%monarch config interrupt_remote off``, as before it existed), same run.

    .venv/bin/python bench/bench_ctrl_c.py [--reps N] [--work S]

A monarch kernel (jupyter_client, as a frontend drives it) connected to a retained
cluster with 4 procs. Each round: a cell calls ``spin(S)`` on the 4 ranks (Python
code between 10 ms sleeps, like a training loop) and waits; once the call is sent,
Kernel → Interrupt; then a cell calls a trivial endpoint on the 4 ranks. Measured:
interrupt request -> that second cell's reply (ms). Without the remote interrupt it
waits for the spin to end (about S s). Baseline: the trivial cell alone. Runs in its
own MONARCH_NB_HOME; exit status 1 if a process is left behind.
"""

from __future__ import annotations

from tidy import isolated_home, ms_row, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import monarch_nb  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from kernels import Kernel  # noqa: E402

SPINNER = textwrap.dedent("""
    import time
    from monarch_nb.actor import Actor, endpoint

    class Spinner(Actor):
        @endpoint
        def spin(self, seconds):
            end = time.time() + seconds
            while time.time() < end:
                time.sleep(0.01)

        @endpoint
        def ping(self):
            return 1
""")
NEXT = "len(spinners.ping.call().get())"


def ctrl_c_to_next_call(kernel: Kernel, work: float) -> float:
    msg_id = kernel.execute(f"f = spinners.spin.call({work})\nprint('waiting', flush=True)\nf.get()")
    assert kernel.wait_for(lambda: "waiting" in kernel.text(msg_id), 30)
    t0 = time.perf_counter()
    kernel.km.interrupt_kernel()
    assert kernel.finish(msg_id, 60)["ename"] == "KeyboardInterrupt"
    kernel.run(NEXT, timeout=work + 60)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--work", type=float, default=5.0, help="seconds the interrupted call would run")
    args = parser.parse_args()
    cluster = monarch_nb.Cluster.start("bench")
    kernel = Kernel("monarch", env={"MONARCH_NB_CLUSTER": "bench"})
    try:
        kernel.run("%monarch procs workers --per-host gpus=4\n" + SPINNER + "%monarch spawn spinners Spinner")
        kernel.run(NEXT)
        rows = {"baseline (next call alone)": [], "interrupt_remote on": [], "interrupt_remote off": []}
        for _ in range(args.reps):  # interleaved, so that load drifts hit all alike
            t0 = time.perf_counter()
            kernel.run(NEXT)
            rows["baseline (next call alone)"].append(time.perf_counter() - t0)
            rows["interrupt_remote on"].append(ctrl_c_to_next_call(kernel, args.work))
            kernel.run("%monarch config interrupt_remote off")
            rows["interrupt_remote off"].append(ctrl_c_to_next_call(kernel, args.work))
            kernel.run("%monarch config interrupt_remote on")
        print(f"Ctrl-C -> next call answered, 4 ranks busy with a {args.work:g} s call, {os.cpu_count()} CPUs, "
              f"median of {args.reps}:")
        for name, values in rows.items():
            print(ms_row(name, values))
    finally:
        kernel.shutdown()
    return stop_and_check(cluster, _OWN_HOME)


if __name__ == "__main__":
    sys.exit(main())
