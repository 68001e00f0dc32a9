"""Hub memory under huge unsigned frames from another local user (issue 22, item 4).

    cd /work/main && .venv/bin/python bench/bench_unsigned_frames.py [--count 3] [--mib 1024]

Starts an ephemeral cluster, resets its hub's peak RSS (``/proc/PID/clear_refs``), has
the second local user (``tests/second_user.py``: needs root and user monarchnb-other)
send COUNT unsigned frames of MIB MiB to the hub's inbox, then checks that the cluster
still spawns and calls, and prints the hub's peak RSS above its baseline (``VmHWM``:
the kernel's own high-water mark, no sampling) and whether the hub survived. Stops the
cluster; exit status 1 if a process of it is left behind.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

# conftest (imported by second_user) sets up an isolated MONARCH_NB_HOME before monarch_nb loads.
from second_user import run_as_other_user  # noqa: E402
from test_unauthenticated_peers import _peak_rss, _reset_peak_rss, _send_unsigned  # noqa: E402
from sample_actors import Counter  # noqa: E402

from conftest import cluster_processes  # noqa: E402
from monarch_nb.client.cluster import Cluster  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--mib", type=int, default=1024)
    args = parser.parse_args()
    cluster = Cluster.start_ephemeral()
    try:
        hub_pid = cluster._info["hub_pid"]
        _reset_peak_rss(hub_pid)
        baseline = _peak_rss(hub_pid)
        started = time.monotonic()
        run_as_other_user(_send_unsigned, cluster._info["hub"], args.mib << 20, args.count, timeout=600)
        sent_s = time.monotonic() - started
        try:
            procs = cluster.this_host().spawn_procs(per_host={"gpus": 1}, name="after")
            works = procs.spawn("c", Counter, 1).incr.call_one(1).get(timeout=60) == 2
            procs.stop()
        except Exception as e:  # noqa: BLE001 - reported, the figure is what matters
            works = f"no: {type(e).__name__}: {e}"
        peak = _peak_rss(hub_pid) - baseline
        print(f"hub peak RSS above baseline under {args.count} unsigned {args.mib} MiB frames: "
              f"{peak / 2**20:.0f} MiB (baseline {baseline / 2**20:.0f} MiB; sent in {sent_s:.1f} s); "
              f"cluster works after: {works}")
    finally:
        cluster.stop()
    left = cluster_processes(cluster.path)
    if left:
        print(f"left behind: {left}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
