"""monarch_nb peak memory of a 1 GiB transfer, each side, next to the raw floor's.

    cd /work/main && .venv/bin/python bench/bench_peak_memory.py [--mib N] [--kinds bytes,numpy]

For each payload type (bytes, bytearray, memoryview, numpy array, CPU torch tensor),
each direction (client -> actor as an argument, actor -> client as a return value) and
each path (shared memory, as between procs of one host; the socket, as across hosts,
forced here by raising ``wire.shm.MIN_BYTES`` on both sides), one transfer of 1 GiB
while a thread samples every 5 ms:

- the RSS of the sending and of the receiving process, above its baseline taken with
  the value already made on the sending side (so the figure is what the transfer
  costs; the receiver's includes the value it receives, which it must hold);
- the bytes held in ``/dev/shm`` by this cluster's segments (pages in a segment that
  a process maps count in its RSS too).

The floor: the same value through a raw pyzmq DEALER/ROUTER + cloudpickle (in-band)
between the same two kinds of process, measured in the same run. Target (issue #16):
each side <= 1.2 GiB above baseline for 1 GiB. Runs in an isolated MONARCH_NB_HOME and
checks no process it started is left behind (exit status 1 if one is).
"""

from __future__ import annotations

import gc
import inspect
import os
import sys
import threading
import time

from bench_actors import leftover_processes, log  # noqa: E402  (sets MONARCH_NB_HOME first)

import cloudpickle  # noqa: E402
import psutil  # noqa: E402
import tidy  # noqa: E402

from monarch_nb.actor import Actor, endpoint, this_host  # noqa: E402

MiB = 1 << 20
KINDS = ("bytes", "bytearray", "memoryview", "numpy", "torch")


def make(kind: str, nbytes: int):
    """A ``kind`` payload of ``nbytes`` bytes, every page touched (ones, not zeros)."""
    import numpy as np

    if kind == "torch":
        import torch

        return torch.ones(nbytes, dtype=torch.uint8)
    array = np.ones(nbytes, np.uint8)
    if kind == "numpy":
        return array
    if kind == "memoryview":
        return memoryview(array)
    if kind == "bytearray":
        return bytearray(array)
    return array.tobytes()


def touch(value) -> int:
    """The payload's size in bytes, after reading its first and last byte."""
    if hasattr(value, "numpy"):
        value = value.numpy()
    view = memoryview(value).cast("B")
    assert view[0] == 1 and view[-1] == 1
    return view.nbytes


class Holder(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def shm_min_bytes(self, value: int) -> None:
        from monarch_nb.wire import shm

        shm.MIN_BYTES = value

    @endpoint
    def make(self, kind: str, nbytes: int) -> None:
        self.value = make(kind, nbytes)

    @endpoint
    def give(self):
        return self.value

    @endpoint
    def drop(self) -> None:
        self.value = None
        gc.collect()

    @endpoint
    def take(self, payload) -> int:
        return touch(payload)


_RAW_SERVER = tidy.RAW_SERVER_PRELUDE + r"""
HELPERS
held = None
while True:
    ident, payload = sock.recv_multipart(copy=False)
    op, arg = cloudpickle.loads(payload.buffer)
    payload = None
    if op == "stop":
        break
    if op == "make":
        held, reply = make(*arg), None
    elif op == "give":
        reply = held
    elif op == "drop":
        held = reply = None
    else:
        reply = touch(arg)
    arg = None
    sock.send_multipart([ident, cloudpickle.dumps(reply)])
    reply = None
sock.close(0); ctx.term()
"""


class RawPeer(tidy.RawClient):
    """The floor: a raw pyzmq DEALER -> ROUTER peer in another process, values pickled
    in-band with cloudpickle (what a plain pyzmq + cloudpickle program does)."""

    def __init__(self):
        super().__init__(_RAW_SERVER.replace("HELPERS", inspect.getsource(make) + inspect.getsource(touch)))

    def request(self, op: str, arg=None):
        self.sock.send(cloudpickle.dumps((op, arg)), copy=False)
        return cloudpickle.loads(self.sock.recv(copy=False).buffer)

    def close(self) -> None:
        super().close(cloudpickle.dumps(("stop", None)))


class Peaks:
    """Sample, every 5 ms in a thread, the RSS of ``pids`` and the bytes in /dev/shm of
    files named ``shm_prefix``*; :meth:`stop` gives each peak above its baseline."""

    def __init__(self, pids: list[int], shm_prefix: str | None):
        self.procs = [psutil.Process(p) for p in pids]
        self.shm_prefix = shm_prefix
        self.base = [p.memory_info().rss for p in self.procs] + [self._shm()]
        self.peaks = list(self.base)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _shm(self) -> int:
        if self.shm_prefix is None:
            return 0
        total = 0
        with os.scandir("/dev/shm") as entries:
            for entry in entries:
                if entry.name.startswith(self.shm_prefix):
                    try:
                        total += entry.stat().st_blocks * 512
                    except FileNotFoundError:
                        pass
        return total

    def _sample(self) -> None:
        now = [p.memory_info().rss for p in self.procs] + [self._shm()]
        self.peaks = [max(a, b) for a, b in zip(self.peaks, now)]

    def _run(self) -> None:
        while not self._done.wait(0.005):
            self._sample()

    def stop(self) -> list[int]:
        self._done.set()
        self._thread.join()
        self._sample()
        return [peak - base for peak, base in zip(self.peaks, self.base)]


def main() -> int:
    import argparse

    from monarch_nb.wire import shm

    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024, help="payload size (MiB)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated payload types")
    parser.add_argument("--paths", default="shm,socket", help="comma-separated: shm, socket")
    args = parser.parse_args()
    nbytes = args.mib * MiB
    kinds = args.kinds.split(",")
    home = os.environ["MONARCH_NB_HOME"]
    try:
        import torch  # noqa: F401  (the client must have it to receive tensors)
    except ImportError:
        kinds = [k for k in kinds if k != "torch"]
    log(f"monarch_nb peak-memory bench: {args.mib} MiB, {os.cpu_count()} CPUs, MONARCH_NB_HOME={home}")
    rows = []  # (path, kind, direction, sender GiB, receiver GiB, shm GiB, seconds)
    raw = RawPeer()
    procs = None
    default_min = shm.MIN_BYTES
    try:
        procs = this_host().spawn_procs(per_host={"gpus": 1}, name="bench_peak_memory")
        holder = procs.spawn("holder", Holder)
        actor_pid = holder.pid.call_one().get()
        prefix = shm._prefix(procs._cluster_id)

        def measure(path: str, kind: str, direction: str, sender: int, receiver: int, transfer) -> None:
            gc.collect()
            peaks = Peaks([sender, receiver], prefix)
            t0 = time.perf_counter()
            transfer()
            took = time.perf_counter() - t0
            send_extra, recv_extra, shm_extra = peaks.stop()
            rows.append((path, kind, direction, send_extra / (1 << 30), recv_extra / (1 << 30),
                         shm_extra / (1 << 30), took))
            log(f"  {path:6} {kind:10} {direction:6}  sender {send_extra / (1 << 30):5.2f}  receiver "
                f"{recv_extra / (1 << 30):5.2f}  /dev/shm {shm_extra / (1 << 30):5.2f} GiB  ({took:.2f} s)")

        me = os.getpid()
        for kind in kinds:  # warm up: imports (torch is ~0.2 GiB) and first-use allocations
            raw.request("take", make(kind, MiB))
            holder.take.call_one(make(kind, MiB)).get(timeout=300)
        for kind in kinds:
            value = make(kind, nbytes)
            measure("raw", kind, "arg", me, raw.pid, lambda: raw.request("take", value))
            value = None
            raw.request("make", (kind, nbytes))
            measure("raw", kind, "return", raw.pid, me, lambda: touch(raw.request("give")))
            raw.request("drop")
        for path in args.paths.split(","):
            min_bytes = default_min if path == "shm" else 1 << 62
            shm.MIN_BYTES = min_bytes
            holder.shm_min_bytes.call_one(min_bytes).get()
            for kind in kinds:
                value = make(kind, nbytes)
                measure(path, kind, "arg", me, actor_pid,
                        lambda: holder.take.call_one(value).get(timeout=300) == nbytes)
                value = None
                holder.make.call_one(kind, nbytes).get(timeout=300)
                measure(path, kind, "return", actor_pid, me,
                        lambda: touch(holder.give.call_one().get(timeout=300)))
                holder.drop.call_one().get()
    finally:
        shm.MIN_BYTES = default_min
        raw.close()
        if procs is not None:
            from monarch_nb.client.cluster import default_cluster

            default_cluster().stop()
    leftovers = leftover_processes(home)
    for line in leftovers:
        log(f"    LEFTOVER {line}")
    log("")
    log(f"peak above baseline (GiB) of a {args.mib} MiB transfer; raw = pyzmq + cloudpickle in-band, same run")
    log(f"{'path':6}  {'type':10}  {'dir':6}  {'sender':>6}  {'receiver':>8}  {'/dev/shm':>8}  {'seconds':>7}")
    for path, kind, direction, send, recv, in_shm, took in rows:
        log(f"{path:6}  {kind:10}  {direction:6}  {send:6.2f}  {recv:8.2f}  {in_shm:8.2f}  {took:7.2f}")
    log(f"target: sender and receiver each <= {1.2 * args.mib / 1024:.2f} GiB above baseline")
    return 1 if leftovers else 0


if __name__ == "__main__":
    sys.exit(main())
