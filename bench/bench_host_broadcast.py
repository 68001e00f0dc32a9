"""A large argument to every actor of a host, through the host's router: written to
shared memory once per host (``wire.shm.sharing``) against once per actor.

    .venv/bin/python bench/bench_host_broadcast.py [--hosts 2] [--per-host 4] [--direct]

Routers on (``MONARCH_NB_ROUTER=on``), ``hosts`` local host agents with ``per-host``
procs each, one actor per proc; with ``--direct``, routers off: the client sends to each
actor itself, and writes the argument once per host of the client (a one-host mesh's
path). Figures: the median time of a call whose argument is a
16 or 64 MiB numpy array (the actor reads one element), and the shared memory the
host's actors hold when each keeps a 256 MiB argument (``Shmem`` of /proc/meminfo).
Baseline, in the same run: the same with the router sending each actor a segment of its
own (``shm.sharing`` replaced by a no-op in every process of the cluster and in the
client, through a ``sitecustomize`` on ``PYTHONPATH``), which is how it was before.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NO_SHARING = """
import contextlib
try:
    import monarch_nb.wire.shm as shm
    shm.sharing = contextlib.nullcontext  # the baseline: one segment per actor
except Exception:
    pass
"""


def shmem_mib() -> float:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Shmem:")) / 1024


def measure(hosts: int, per_host: int, direct: bool) -> None:
    """One configuration, in this process (the mode is whatever PYTHONPATH gives)."""
    from tidy import isolated_home

    own_home = isolated_home()
    os.environ["MONARCH_NB_ROUTER"] = "off" if direct else "on"
    import numpy as np

    from monarch_nb.actor import Actor, endpoint
    from monarch_nb.client.cluster import Cluster

    from tidy import stop_and_check

    class Sink(Actor):
        @endpoint
        def take(self, array) -> int:
            return int(array[-1])

        @endpoint
        def keep(self, array) -> int:
            self.kept = array
            return int(array[-1])

    cluster = Cluster.start_ephemeral(hosts=hosts)
    try:
        mesh = cluster.host_mesh().spawn_procs(per_host={"gpus": per_host}).spawn("sink", Sink)
        for mib in (16, 64):
            array = np.ones(mib << 17, np.int64)
            mesh.take.call(array).get(timeout=120)
            times = []
            for _ in range(7):
                started = time.perf_counter()
                mesh.take.call(array).get(timeout=120)
                times.append(time.perf_counter() - started)
            print(f"call_{mib}_ms {statistics.median(times) * 1e3:.1f}")
        before = shmem_mib()
        mesh.keep.call(np.ones(256 << 17, np.int64)).get(timeout=120)
        print(f"kept_256_shm_mib {shmem_mib() - before:.0f}")
    finally:
        sys.exit(stop_and_check(cluster, own_home))


def run(hosts: int, per_host: int, direct: bool, sharing: bool) -> dict[str, float]:
    here = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory() as patch:
        paths = [str(here)]
        if not sharing:
            Path(patch, "sitecustomize.py").write_text(NO_SHARING)
            paths.insert(0, patch)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")])}
        out = subprocess.run([sys.executable, __file__, "--measure", "--hosts", str(hosts), "--per-host",
                              str(per_host)] + ["--direct"] * direct, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise SystemExit(f"measuring failed:\n{out.stdout}\n{out.stderr}")
    return {k: float(v) for k, v in (line.split() for line in out.stdout.splitlines() if line.count(" ") == 1)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--per-host", type=int, default=4)
    parser.add_argument("--direct", action="store_true", help="routers off: the client sends to each actor")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.hosts, args.per_host, args.direct)
        return 0
    once = run(args.hosts, args.per_host, args.direct, True)
    each = run(args.hosts, args.per_host, args.direct, False)
    actors = args.hosts * args.per_host
    path = "sent by the client to each actor" if args.direct else "through their routers"
    print(f"a large argument to {actors} actors on {args.hosts} hosts, {path} "
          f"(once per host vs once per actor, same run):")
    for key, label in (("call_16_ms", "call, 16 MiB argument (ms)"), ("call_64_ms", "call, 64 MiB argument (ms)"),
                       ("kept_256_shm_mib", "shared memory held, 256 MiB kept (MiB)")):
        print(f"  {label:42} {once[key]:8.0f} {each[key]:8.0f}   {each[key] / once[key]:5.1f}x less")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
