"""The Ctrl-C storm's cost: wall time of a client interrupted at random while it calls,
next to the same client left alone for the same time (same run).

    cd /work/main && .venv/bin/python bench/bench_interrupts.py [--interrupts N]

Both runs are ``tests/interrupt_client.py storm``: an ephemeral cluster with two procs,
a loop over call / call_one / choose / broadcast / stream, then 200 checked call and
call_one pairs. With interrupts, SIGINT comes every 1-15 ms (N of them); without, the
loop runs as long as the interrupted one did. Printed: calls made per second in the
loop, the checked calls' wall time, how many interrupts landed, and what was lost
(must be nothing). Runs in its own MONARCH_NB_HOME.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"


def run(interrupts: int, seconds: float | None) -> tuple[dict, float]:
    client = subprocess.Popen([sys.executable, str(TESTS / "interrupt_client.py"), "storm"], cwd=TESTS,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(TESTS)})
    assert client.stdout.readline().startswith("READY")
    started = time.perf_counter()
    rng = random.Random(12)
    if seconds is None:
        for _ in range(interrupts):
            time.sleep(rng.uniform(0.001, 0.015))
            client.send_signal(signal.SIGINT)
    else:
        time.sleep(seconds)
    storm_s = time.perf_counter() - started
    client.send_signal(signal.SIGUSR1)
    out, _ = client.communicate(timeout=300)
    report = json.loads(out.strip().splitlines()[-1])
    report["checked_s"] = time.perf_counter() - started - storm_s
    return report, storm_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--interrupts", type=int, default=1000)
    args = parser.parse_args()
    os.environ.setdefault("MONARCH_NB_HOME", tempfile.mkdtemp(prefix="monarch_nb_bench_"))
    stormy, storm_s = run(args.interrupts, None)
    calm, _ = run(0, storm_s)
    print(f"storm of {args.interrupts} SIGINTs over {storm_s:.1f} s; {stormy['interrupts']} landed in calls")
    for name, r in (("calm", calm), ("storm", stormy)):
        print(f"  {name:5}  loop calls {r['loop_calls'] / storm_s:7.0f}/s   checked 400 calls + stop "
              f"{r['checked_s']:.2f} s   lost {len(r['lost'])}  wrong {r['wrong']}  duplicates {r['duplicates']}  "
              f"dropped {r['dropped_client']}+{sum(r['dropped_procs'])}  other errors {len(r['other_errors'])}")


if __name__ == "__main__":
    main()
