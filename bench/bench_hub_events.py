"""Hub CPU per proc-death event against the number of procs N, the hub's own code
driven in process (no real procs, no sockets): ``Supervision.proc_exited`` as a host
agent's exit report calls it, with a real ``Registry`` writing its state to a temporary
directory, the real ``MeshOps`` (which tells clients which actors died and stops the
meshes they owned), and fakes for the network, the clients and the log store.

    .venv/bin/python bench/bench_hub_events.py [--sizes 32 128 512] [--events 32]
    .venv/bin/python bench/bench_hub_events.py --old 2cc012f 14464d8   # and older versions, same run

Two shapes of N procs, each with an actor mesh over every proc mesh:
``one mesh``: one proc mesh of N procs (a preempted training job); ``meshes of 8``:
N/8 proc meshes of 8 procs (services, replicas). ``events`` procs die one at a time,
each its own pass of the event loop (as exit reports arrive). ``host failed``: one mesh
of N procs on N/8 hosts; ``events`` hosts fail one at a time (an allocation preempted),
each failing its 8 procs. Per event:
``loop CPU``: the event loop thread's CPU (``time.thread_time``) in ms, the hub's
budget for every other client; ``loop wall``: the time the loop was busy with it
(waiting for a disk included); ``all CPU``: the process's CPU (writer threads
included). ``--old REF...`` checks each REF out with ``git worktree`` into a temporary
directory and runs the same measurement on it in a child process (removed after).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class _Allocator:
    def spec(self) -> dict:
        return {"kind": "local"}


class _Announcer:
    def __init__(self) -> None:
        self.events = 0

    def health_changed(self) -> None:
        pass

    async def announce(self, event: dict) -> None:
        self.events += 1


class _Net:
    address = "tcp://127.0.0.1:1"

    def forget(self, address: str) -> None:
        pass

    async def send(self, *args, **kwargs) -> None:
        pass


class _Store:
    def last(self, proc: str, stream: str, n: int, scan: int = 10_000) -> list:
        return []


def _measure(sizes: list[int], events: int) -> dict:
    """{shape: {N: {"loop_cpu_ms", "loop_wall_ms", "all_cpu_ms"}}} for the monarch_nb imported."""
    from monarch_nb.hub.mesh_ops import MeshOps
    from monarch_nb.hub.records import ActorMeshRecord, ProcMeshRecord, ProcRecord
    from monarch_nb.hub.registry import Registry
    from monarch_nb.hub.supervision import Supervision
    from monarch_nb.protocol import agent_ops

    from monarch_nb.hub.records import HostRecord

    def populate(registry, n: int, per_mesh: int) -> list[ProcRecord]:
        procs = []
        for h in range(n // 8):  # 8 procs per host
            registry.hosts[f"host{h}"] = HostRecord(f"host{h}", f"tcp://127.0.0.1:{50000 + h}", 90000 + h, f"node{h}")
        for m in range(n // per_mesh):
            name = f"p{m}"
            mesh = ProcMeshRecord(name, {"gpus": per_mesh},
                                  [ProcRecord(f"{name}/{r}", f"host{(len(procs) + r) // 8}",
                                              f"tcp://127.0.0.1:{10000 + len(procs) + r}",
                                              100000 + len(procs) + r) for r in range(per_mesh)])
            registry.proc_meshes[name] = mesh
            registry.actor_meshes[f"{name}/w"] = ActorMeshRecord(
                "w", name, list(range(per_mesh)), {"gpus": per_mesh}, "Worker", {"step": False}, [],
                [f"tcp://127.0.0.1:{30000 + len(procs) + r}" for r in range(per_mesh)], f"payload-{name}")
            procs.extend(mesh.procs)
        return procs

    async def one(n: int, per_mesh: int, folder: Path, hosts_fail: bool) -> dict:
        announcer = _Announcer()
        registry = Registry(folder, False, _Allocator(), announcer, None)
        procs = populate(registry, n, per_mesh)
        saved = registry.save()
        if saved is not None:
            await saved
        supervision = Supervision(registry, _Net(), announcer, _Store(),
                                  MeshOps(registry, _Net(), announcer, None, None))
        if hasattr(registry, "find_proc"):  # steady state: indexes built (as at a hub's start)
            registry.find_proc(procs[0].proc_id)
        step = max(1, len(procs) // events)
        dying = procs[::step][:events]
        hosts = list(registry.hosts.values())
        failing = hosts[::max(1, len(hosts) // events)][:events] if hosts_fail else []
        cpu = wall = every = 0.0
        for proc_or_host in failing or dying:
            t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
            if failing:
                await supervision.host_failed(proc_or_host, "its allocation ended")
            else:
                proc = proc_or_host
                await supervision.proc_exited({agent_ops.PROC_ID: proc.proc_id, "pid": proc.pid, "returncode": -9},
                                              None)
            for _ in range(3):  # the passes that write the change and escalate the failure
                await asyncio.sleep(0)
            cpu += time.thread_time() - c0
            wall += time.perf_counter() - t0
            every += time.process_time() - p0
        if hasattr(registry, "close"):
            registry.close()
        k = len(failing or dying)
        return {"loop_cpu_ms": cpu / k * 1e3, "loop_wall_ms": wall / k * 1e3, "all_cpu_ms": every / k * 1e3}

    results: dict = {}
    sys.stderr = open(os.devnull, "w")  # the hub's notices of each failure (its hub.log)
    for shape, per_mesh, hosts_fail in (("one mesh", None, False), ("meshes of 8", 8, False),
                                        ("host failed", None, True)):
        for n in sizes:
            with tempfile.TemporaryDirectory() as folder:
                results.setdefault(shape, {})[n] = asyncio.run(one(n, per_mesh or n, Path(folder), hosts_fail))
    return results


def _old(ref: str, sizes: list[int], events: int) -> dict:
    """The measurement of ``ref``'s monarch_nb, in a child process on a worktree."""
    with tempfile.TemporaryDirectory() as parent:
        tree = Path(parent) / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref], check=True,
                       capture_output=True)
        try:
            out = subprocess.run([sys.executable, __file__, "--json", "--sizes", *map(str, sizes),
                                  "--events", str(events)], check=True, capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False,
                           capture_output=True)
    return json.loads(out.stdout)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="*", default=[32, 128, 512])
    parser.add_argument("--events", type=int, default=32)
    parser.add_argument("--old", nargs="*", default=[], help="git refs to measure too, in the same run (e.g. HEAD~20)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    args = parser.parse_args()
    sys.path.insert(0, os.environ.get("PYTHONPATH") or str(ROOT))
    runs = {}
    for ref in args.old:
        runs[ref] = _old(ref, args.sizes, args.events)
    runs["this tree"] = _measure(args.sizes, args.events)
    if args.json:
        print(json.dumps(runs["this tree"]))
        return 0
    print(f"hub per event (a proc's death; a host's failure), ms (mean of {args.events} events, one per loop pass)")
    print(f"{'version':<18} {'shape':<12} {'N procs':>8} {'loop CPU':>9} {'loop wall':>10} {'all CPU':>8}")
    for version, results in runs.items():
        for shape, by_n in results.items():
            for n, r in by_n.items():
                print(f"{version:<18} {shape:<12} {n:>8} {r['loop_cpu_ms']:>9.3f} {r['loop_wall_ms']:>10.3f} "
                      f"{r['all_cpu_ms']:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
