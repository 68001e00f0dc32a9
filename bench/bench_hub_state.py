"""Hub state benchmark: the hub's CPU per proc-death event and per spawn against the
number of procs N, with the state kept on disk (a retained cluster).

    .venv/bin/python bench/bench_hub_state.py [--quick] [--sizes 8 32 64]
    PYTHONPATH=/path/to/old/checkout .venv/bin/python bench/bench_hub_state.py   # an older version

1. Real processes, N = 8, 32, 64 procs live in the cluster: the hub's CPU time
   (psutil cpu_times, user + system, in 10 ms ticks: the mean over ``reps`` events) per
   spawn of a 1-proc actor mesh, and per SIGKILL of a proc while a call waits on it
   (from the kill to the call's SupervisionError). Includes the hub's background work
   meanwhile (heartbeats), the same for every N.
2. In process, no processes: the event loop's CPU time (thread_time) per proc exit
   saved by the registry, N = 512 and 2,048 procs; the point: flat in N. A version whose
   ``Registry.save`` takes no records rewrites the whole state on each.

Runs in an isolated MONARCH_NB_HOME; exit status 1 if a process is left behind.
"""

from __future__ import annotations

from tidy import isolated_home, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import asyncio  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import psutil  # noqa: E402

import monarch_nb  # noqa: E402
import monarch_nb.actor  # noqa: E402
from monarch_nb.actor import Actor, SupervisionError, endpoint  # noqa: E402
from monarch_nb.hub.records import ProcMeshRecord, ProcRecord  # noqa: E402
from monarch_nb.hub.registry import Registry  # noqa: E402


class Busy(Actor):
    @endpoint
    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    @endpoint
    def ping(self) -> int:
        return os.getpid()


def _cpu(hub: psutil.Process) -> float:
    t = hub.cpu_times()
    return t.user + t.system


def _real(sizes: list[int], reps: int) -> int:
    cluster = monarch_nb.Cluster.start("bench-hub-state")
    hub = psutil.Process(cluster._info["hub_pid"])
    monarch_nb.actor.unhandled_fault_hook = lambda failure: None  # the kills are ours
    print(f"real processes: hub CPU ms per event (mean of {reps} spawns, {reps} single deaths at most); "
          "a burst: every proc of the mesh SIGKILLed at once, one call waiting on each")
    print(f"{'N procs':>8} {'per spawn':>10} {'per death':>10} {'burst: per death':>17} {'last error after':>17}")
    try:
        for n in sizes:
            procs = cluster.host_mesh().spawn_procs(per_host={"gpus": n}, name=f"p{n}")
            mesh = procs.spawn("busy", Busy)
            mesh.ping.call().get()
            pids = procs.pids  # in rank order
            spawns = deaths = 0.0
            for i in range(reps):
                before = _cpu(hub)
                procs.slice(gpus=i % n).spawn(f"one{i}", Busy)
                spawns += _cpu(hub) - before
            singles = min(reps, n // 2)
            for i in range(singles):
                rank = mesh.slice(gpus=n - 1 - i)
                pending = rank.wait.call_one(120)
                before = _cpu(hub)
                os.kill(pids[n - 1 - i], signal.SIGKILL)
                try:
                    pending.get(timeout=60)
                except SupervisionError:
                    pass
                deaths += _cpu(hub) - before
            left = n - singles
            pending = [mesh.slice(gpus=r).wait.call_one(120) for r in range(left)]
            before, t0 = _cpu(hub), time.monotonic()
            for r in range(left):
                os.kill(pids[r], signal.SIGKILL)
            for future in pending:
                try:
                    future.get(timeout=60)
                except SupervisionError:
                    pass
            wall, burst = time.monotonic() - t0, _cpu(hub) - before
            print(f"{n:>8} {spawns / reps * 1e3:>10.2f} {deaths / singles * 1e3:>10.2f} "
                  f"{burst / left * 1e3:>14.2f} ({left}) {wall:>15.3f} s", flush=True)
            procs.stop()
    finally:
        status = stop_and_check(cluster, None)
    return status


class _Allocator:
    def spec(self) -> dict:
        return {"kind": "local"}


class _Announcer:
    def health_changed(self) -> None:
        pass


def _in_process(sizes: list[int], events: int) -> None:
    print("in process: event loop CPU ms per proc exit saved (registry only)")

    async def one(n: int, folder: Path) -> float:
        registry = Registry(folder, False, _Allocator(), _Announcer(), None)
        mesh = registry.proc_meshes["p"] = ProcMeshRecord(
            "p", {"gpus": n}, [ProcRecord(f"p/{r}", "host0", f"tcp://127.0.0.1:{r}", 1000 + r) for r in range(n)])
        saved = registry.save()
        if saved is not None:
            await saved
        spent = 0.0
        for proc in mesh.procs[:events]:  # one at a time, each its own event
            t0 = time.thread_time()
            found = registry.find_proc(proc.proc_id)
            proc.exit_code = -9
            try:
                saved = registry.save(proc)
            except TypeError:  # a version that rewrites everything on every change
                saved = registry.save()
            spent += time.thread_time() - t0
            if saved is not None:
                await saved
            assert found is not None
        if hasattr(registry, "close"):
            registry.close()
        return spent / events

    for n in sizes:
        with tempfile.TemporaryDirectory() as folder:
            print(f"{n:>8} procs: {asyncio.run(one(n, Path(folder))) * 1e3:.3f} ms")


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # (a timeout's kill) the retained cluster is stopped too
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", type=int, nargs="*", help="procs per mesh for part 1 (default 8 32 64)")
    args = parser.parse_args()
    print("monarch_nb from", os.path.dirname(monarch_nb.__file__))
    _in_process([512, 2048], 20 if args.quick else 100)
    status = _real(args.sizes or ([8, 32] if args.quick else [8, 32, 64]), 8 if args.quick else 30)
    if _OWN_HOME:
        import shutil
        shutil.rmtree(_OWN_HOME, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
