"""torch.distributed benchmark: all_reduce of a 64 MiB tensor across 4 procs, over gloo
vs through endpoint calls.

    .venv/bin/python bench/bench_torch.py [--quick] [--mib 64] [--reps 10]

4 procs (``spawn_procs(per_host={"gpus": 4})``) each hold a float32 tensor of MIB MiB
filled with rank + 1; after a reduction every rank holds the sum (10 everywhere).

- gloo: ``setup_torch_distributed(backend="gloo")``, one actor per proc joins the group;
  the client calls an endpoint that copies the rank's tensor into a buffer and runs
  ``dist.all_reduce`` on it (the copy keeps every repetition's input the same).
- endpoints: the same reduction done by the client: ``call()`` returns the 4 tensors
  (out-of-band frames), the client adds them, and a second ``call()`` sends the sum to
  every rank, which keeps it.

Both are timed at the client, from the call to the last reply (median of REPS after a
warm-up, in interleaved blocks); the gloo figure also gives the time inside
``all_reduce`` as measured in the procs. Baseline: the endpoint path, measured in the
same run; the ratio is endpoints / gloo. Runs in an isolated MONARCH_NB_HOME; exit
status 1 if a process is left behind.
"""

from __future__ import annotations

from tidy import isolated_home, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from monarch_nb.actor import Actor, current_rank, endpoint, this_host  # noqa: E402
from monarch_nb.client.runtime import runtime  # noqa: E402


class Reducer(Actor):
    def __init__(self, mib: int):
        import torch.distributed as dist

        torch.set_num_threads(1)
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        self.mine = torch.full((mib << 18,), float(current_rank().rank + 1))  # 4 bytes each
        self.buf = torch.empty_like(self.mine)
        self.kept = None

    @endpoint
    def gloo_all_reduce(self) -> tuple[float, float]:
        """(first element of the sum, seconds inside all_reduce)."""
        import torch.distributed as dist

        self.buf.copy_(self.mine)
        t = time.perf_counter()
        dist.all_reduce(self.buf)
        return self.buf[0].item(), time.perf_counter() - t

    @endpoint
    def tensor(self):
        return self.mine

    @endpoint
    def keep(self, total) -> float:
        self.kept = total
        return total[0].item()

    @endpoint
    def close(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()


def via_gloo(mesh) -> tuple[float, float]:
    t = time.perf_counter()
    results = mesh.gloo_all_reduce.call().get().values()
    elapsed = time.perf_counter() - t
    assert {first for first, _ in results} == {10.0}, results
    return elapsed, max(inside for _, inside in results)


def via_endpoints(mesh) -> float:
    t = time.perf_counter()
    tensors = mesh.tensor.call().get().values()
    total = tensors[0].clone()
    for other in tensors[1:]:
        total += other
    firsts = mesh.keep.call(total).get().values()
    elapsed = time.perf_counter() - t
    assert set(firsts) == {10.0}, firsts
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="3 repetitions")
    parser.add_argument("--mib", type=int, default=64, help="tensor size per rank (MiB)")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    reps = 3 if args.quick else args.reps
    host = this_host()
    cluster = runtime().cluster
    try:
        procs = host.spawn_procs(per_host={"gpus": 4}, name="reducers")
        procs.setup_torch_distributed(backend="gloo")
        mesh = procs.spawn("reducers", Reducer, args.mib)
        via_gloo(mesh), via_endpoints(mesh)  # warm-up: connections, allocations
        gloo, inside, endpoints = [], [], []
        for _ in range(reps):  # interleaved, so both see the same machine
            elapsed, in_proc = via_gloo(mesh)
            gloo.append(elapsed)
            inside.append(in_proc)
            endpoints.append(via_endpoints(mesh))
        mesh.close.call().get()
        g, e = statistics.median(gloo), statistics.median(endpoints)
        mib = args.mib
        print(f"all_reduce of {mib} MiB float32 across 4 procs (median of {reps}):\n"
              f"  gloo all_reduce via setup_torch_distributed: {g * 1e3:.0f} ms at the client "
              f"({statistics.median(inside) * 1e3:.0f} ms inside all_reduce, slowest rank); "
              f"{mib / g:.0f} MiB/s of tensor per rank\n"
              f"  endpoint calls (4 tensors to the client, summed, sum sent to 4): {e * 1e3:.0f} ms; "
              f"{mib / e:.0f} MiB/s\n"
              f"  ratio endpoints / gloo: {e / g:.1f}", flush=True)
        procs.stop()
    finally:
        status = stop_and_check(cluster, _OWN_HOME)
    return status


if __name__ == "__main__":
    sys.exit(main())
