"""Fold ratio under CPU load: how many lines a user sees when 8 ranks print the same lines,
next to the arrival-window-only folding this client used before, measured in the same run.

    .venv/bin/python bench/bench_fold.py [--hogs N] [--calls N]

8 actors in 8 procs each print the same two lines per call (and one line of their own);
``--hogs`` CPU hogs (default: three per CPU) keep the machine busy so ranks run late, as
they do on a loaded node. Figure: identical lines shown / identical lines printed (the
ideal is 1/8 = 0.125: one folded line per 8 ranks; 1.0 is no folding at all), for

  this client               a rank's late line of the previous call moves ahead of a
                            group it would otherwise have to stay behind
  baseline                  the folder of the last commit before that (from git history):
                            a rank whose previous line arrived after a group's first line
                            starts a group of its own

and that no line was lost and each rank's own line stayed after its shared lines.
Runs in an isolated MONARCH_NB_HOME and checks that no process it started is left behind
(exit status 1 if one is).
"""

from __future__ import annotations

from tidy import isolated_home, module_from_git, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

from monarch_nb.actor import Actor, current_rank, endpoint, this_host  # noqa: E402
from monarch_nb.client.runtime import runtime  # noqa: E402

SHARED = ("loading shard", "step done")
HOG = "import os, time\nparent = os.getppid()\nwhile os.getppid() == parent:\n    sum(range(100_000))\n"


class Talker(Actor):
    @endpoint
    def step(self, i: int) -> None:
        print(f"{SHARED[0]} {i}")
        print(f"{SHARED[1]} {i}")
        print(f"rank {current_rank().rank} own line {i}")


class Shown:
    """The sink: every folded line the cell would show."""

    def __init__(self):
        self.lines = []
        self.lock = threading.Lock()

    def __call__(self, lines):
        with self.lock:
            self.lines.extend(lines)

    def take(self):
        with self.lock:
            lines, self.lines = self.lines, []
        return lines


def measure(talkers, cluster, shown: Shown, calls: int, first: int) -> tuple[float, int, bool]:
    """(shown / printed for the shared lines, lines lost, each rank's order kept)."""
    for i in range(first, first + calls):
        talkers.step.call(i).get()
    assert cluster.flush_logs(timeout=60)
    runtime().lines.emit_due(float("inf"))  # what still waits for its window, as the cell's end does
    lines = shown.take()
    shared = [g for g in lines if g.text.rsplit(" ", 1)[0] in SHARED]
    printed = 8 * len(SHARED) * calls
    seen = sum(len(g.ranks) for g in lines)
    lost = 8 * (len(SHARED) + 1) * calls - seen
    order_kept = True
    for rank in range(8):
        texts = [g.text for g in lines if rank in g.ranks]
        for i in range(first, first + calls):
            want = [f"{SHARED[0]} {i}", f"{SHARED[1]} {i}", f"rank {rank} own line {i}"]
            got = [t for t in texts if t.endswith(f" {i}")]
            order_kept &= got == want
    return len(shared) / printed, lost, order_kept


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hogs", type=int, default=3 * (os.cpu_count() or 2),
                        help="CPU hogs beside (default: three per CPU)")
    parser.add_argument("--calls", type=int, default=30, help="calls per figure (default 30)")
    args = parser.parse_args()
    print(f"monarch_nb fold bench: {os.cpu_count()} CPUs, {args.hogs} CPU hogs, {args.calls} calls x 8 ranks",
          flush=True)
    procs = this_host().spawn_procs(per_host={"gpus": 8})
    cluster = runtime().cluster
    shown = Shown()
    runtime().set_line_sink(shown)
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    folder = runtime().lines.folder
    old, commit = module_from_git("monarch_nb/client/logs.py", lambda source: "_joinable" not in source,
                                  package="monarch_nb.client")
    try:
        talkers = procs.spawn("talkers", Talker)
        talkers.step.call(-1).get()  # warm-up
        cluster.flush_logs(timeout=60)
        runtime().lines.emit_due(float("inf"))
        shown.take()
        first = 0
        for label, this in (("this client", folder), (f"baseline ({commit})", old.Folder())):
            runtime().lines.folder = this
            ratio, lost, order_kept = measure(talkers, cluster, shown, args.calls, first)
            first += args.calls
            print(f"  {label:24} shown / printed {ratio:.3f}  (ideal {1 / 8:.3f}; no folding 1.000)  "
                  f"lost {lost}, each rank's order kept: {'yes' if order_kept else 'NO'}", flush=True)
    finally:
        runtime().lines.folder = folder
        for hog in hogs:
            hog.kill()
            hog.wait()
        runtime().set_line_sink(None)
        status = stop_and_check(cluster, _OWN_HOME)
    return status


if __name__ == "__main__":
    sys.exit(main())
