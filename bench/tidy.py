"""What the benchmarks share: an isolated MONARCH_NB_HOME and the leftover check."""

from __future__ import annotations

import os
import shutil
import tempfile

import psutil


def isolated_home() -> str | None:
    """Use a fresh temp MONARCH_NB_HOME unless one is set; returns it if it is ours."""
    if os.environ.get("MONARCH_NB_HOME"):
        return None
    home = os.environ["MONARCH_NB_HOME"] = tempfile.mkdtemp(prefix="monarch_nb_bench_")
    return home


def stop_and_check(cluster, own_home: str | None) -> int:
    """Stop ``cluster``, delete ``own_home``; prints what was left running and returns
    the exit status (1 if any process of the cluster outlived it)."""
    path = str(cluster.path)
    cluster.stop()
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if path in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE]
    if own_home:
        shutil.rmtree(own_home, ignore_errors=True)
    if left:
        print(f"processes left behind: {left}", flush=True)
        return 1
    return 0
