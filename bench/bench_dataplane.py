"""monarch_nb data-plane benchmark: large payloads, each figure next to a same-run baseline.

    cd /work/main && .venv/bin/python bench/bench_dataplane.py [--quick] [--no-memory] [--one-way]

Figures (see bench/README.md, "bench_dataplane.py"):
  1. one way   64 MiB client -> actor (the endpoint touches the payload and returns its
               size), for bytes, a numpy array and a torch tensor (when torch is
               installed), one call at a time, median GB/s; the floor is the same payload
               through a raw pyzmq DEALER/ROUTER + cloudpickle in another process
  2. call_one  small-message call_one median, interleaved with a raw zmq echo floor
               (the "small messages unchanged" check: compare across commits by ratio)
  3. memory    peak RSS above baseline of the client and of the actor's proc while 1 GiB
               of bytes, then of a numpy array, goes client -> actor (psutil sampling every 5 ms;
               bench_peak_memory.py covers every type, both ways, both paths, against the floor)
  5. RDMA      1 GiB actor -> actor on one host through RDMABuffer.read_into (timed in the
               reading actor, destination preallocated), against a memcpy of 1 GiB (numpy
               copyto) in that actor, interleaved
  4. threshold one frame set of one buffer, encoded, sent to an inbox of this process and
               decoded, through shared memory vs through loopback TCP, at sizes around
               wire.shm.MIN_BYTES (interleaved; what the threshold was chosen from)

Runs in an isolated MONARCH_NB_HOME (a temp dir unless already set) and checks that no
process it started is left behind; exit status 1 if one is.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time

# bench_actors sets up the isolated MONARCH_NB_HOME on import, before monarch_nb loads.
from bench_actors import (SMALL_ARG, RawEchoServers, interleaved, leftover_processes, log,  # noqa: E402
                          summary, timed_loop)

import cloudpickle  # noqa: E402
import psutil  # noqa: E402
import zmq  # noqa: E402
import tidy  # noqa: E402  (beside this script)

from monarch_nb.actor import Actor, endpoint, this_host  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30

# The floor's server: unpickles what it gets (as a receiver must) and answers its size.
_SINK_SERVER = tidy.RAW_SERVER_PRELUDE + r"""
while True:
    ident, payload = sock.recv_multipart(copy=False)
    args, kwargs = cloudpickle.loads(payload.buffer)
    if args[0] is None:
        break
    data = args[0].numpy() if hasattr(args[0], "numpy") else args[0]
    sock.send_multipart([ident, cloudpickle.dumps(len(memoryview(data).cast("B")))])
sock.close(0); ctx.term()
"""


class RawSink(tidy.RawClient):
    """The floor: a raw pyzmq DEALER -> ROUTER in another process, payload pickled in-band
    with cloudpickle (what a plain pyzmq + cloudpickle program does)."""

    def __init__(self):
        super().__init__(_SINK_SERVER)

    def send(self, value) -> int:
        self.sock.send(cloudpickle.dumps(((value,), {})), copy=False)
        return cloudpickle.loads(self.sock.recv())

    def close(self) -> None:
        super().close(cloudpickle.dumps(((None,), {})))


class Sink(Actor):
    @endpoint
    def take(self, payload):
        if hasattr(payload, "numpy"):  # a CPU tensor
            payload = payload.numpy()
        view = memoryview(payload).cast("B")
        return len(view) if view[0] >= 0 and view[-1] >= 0 else -1  # touches both ends

    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def own(self, nbytes: int):
        import numpy as np

        from monarch_nb.rdma import RDMABuffer

        self.owned = np.ones(nbytes, np.uint8)
        return RDMABuffer(memoryview(self.owned))

    @endpoint
    def pull(self, buffer, reps: int) -> tuple[list[float], list[float]]:
        """(seconds per read_into, seconds per memcpy of as many bytes here), interleaved."""
        import numpy as np

        dst = np.zeros(buffer.size(), np.uint8)
        local = np.ones(buffer.size(), np.uint8)
        np.copyto(dst, local)  # fault the destination in before timing either
        reads, copies = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            buffer.read_into(memoryview(dst)).get()
            t1 = time.perf_counter()
            np.copyto(dst, local)
            reads.append(t1 - t0)
            copies.append(time.perf_counter() - t1)
        buffer.read_into(memoryview(dst)).get()
        assert dst[0] == 1 and dst[-1] == 1
        return reads, copies


class PeakRss:
    """Sample the RSS of ``pids`` every 5 ms in a thread; ``peaks`` after :meth:`stop`."""

    def __init__(self, pids: list[int]):
        self.procs = [psutil.Process(p) for p in pids]
        self.base = [p.memory_info().rss for p in self.procs]
        self.peaks = list(self.base)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.005):
            for i, p in enumerate(self.procs):
                self.peaks[i] = max(self.peaks[i], p.memory_info().rss)

    def stop(self) -> list[int]:
        """Stop sampling; the peak above baseline of each pid (bytes)."""
        self._done.set()
        self._thread.join()
        for i, p in enumerate(self.procs):
            self.peaks[i] = max(self.peaks[i], p.memory_info().rss)
        return [peak - base for peak, base in zip(self.peaks, self.base)]


def shm_threshold(reps: int) -> list[tuple[int, float, float]]:
    """(size, seconds through shared memory, seconds through TCP) for one encoded frame
    set of one buffer, sent to an inbox of this process and decoded."""
    import numpy as np

    from monarch_nb.wire import frames, shm, sockets

    frames.register_key("bench-threshold", os.urandom(32))
    inbox, address = sockets.bind_inbox()
    outbox, guard = sockets.Outbox(), frames.ReplayGuard()
    default = shm.MIN_BYTES
    out = []
    try:
        for size in (256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20):
            value = np.ones(size, np.uint8)

            def through(min_bytes):
                shm.MIN_BYTES = min_bytes
                # encoded as a call's arguments are: signed as it leaves, by the route it takes
                outbox.send(address, frames.encode_value("bench-threshold", {}, value, sign_at_send=True))
                while True:  # through TCP, from 4 MiB on, chunks come first (wire.stream)
                    try:
                        frames.decode(sockets.recv_frames(inbox), guard)
                        break
                    except frames.Absorbed:
                        continue

            got = interleaved({"shm": lambda: through(1), "tcp": lambda: through(1 << 62)},
                              total=reps * 4, blocks=4, warmup=2)
            out.append((size, statistics.median(got["shm"]), statistics.median(got["tcp"])))
    finally:
        shm.MIN_BYTES = default
        outbox.close_thread_sockets()
        inbox.close(0)
    return out


def payloads(nbytes: int) -> dict:
    import numpy as np

    out = {"bytes": bytes(nbytes), "numpy": np.ones(nbytes, dtype=np.uint8)}
    try:
        import torch
    except ImportError:
        log("    torch not installed: no torch figure")
    else:
        out["torch"] = torch.ones(nbytes // 4, dtype=torch.float32)
    return out


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    parser.add_argument("--no-memory", action="store_true", help="skip the 1 GiB peak-memory figure")
    parser.add_argument("--one-way", action="store_true", help="only figure 1 (64 MiB one way)")
    args = parser.parse_args()
    reps = 3 if args.quick else 7
    n_small = 300 if args.quick else 2000
    nbytes = 64 * MiB
    home = os.environ["MONARCH_NB_HOME"]
    log(f"monarch_nb data-plane bench: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, "
        f"pyzmq {zmq.__version__}, MONARCH_NB_HOME={home}")
    started = time.perf_counter()
    rows = []  # (figure, value, baseline, ratio)
    raw = RawSink()
    echo_floor = RawEchoServers(1)
    procs = None
    try:
        procs = this_host().spawn_procs(per_host={"gpus": 1}, name="bench_dataplane")
        sink = procs.spawn("sink", Sink)
        # 1. one way, per payload kind, raw floor and monarch_nb interleaved ------------
        for kind, value in payloads(nbytes).items():
            expected = raw.send(value)
            assert sink.take.call_one(value).get() == expected == nbytes
            got = interleaved({"floor": lambda: raw.send(value),
                               "monarch_nb": lambda: sink.take.call_one(value).get()},
                              total=reps * 2, blocks=2, warmup=1)
            floor_gbps = nbytes / statistics.median(got["floor"]) / 1e9
            ours_gbps = nbytes / statistics.median(got["monarch_nb"]) / 1e9
            log(f"[1] 64 MiB {kind} client->actor: {ours_gbps:.3f} GB/s, floor {floor_gbps:.3f} GB/s "
                f"({ours_gbps / floor_gbps:.2f}x)  (raw reply {expected})")
            rows.append((f"64 MiB {kind} one way (GB/s)", ours_gbps, floor_gbps, ours_gbps / floor_gbps))
            value = None
        # 2. small call_one -----------------------------------------------------------
        if args.one_way:
            raise _OneWayDone
        got = interleaved({"floor": lambda: echo_floor.echo(SMALL_ARG),
                           "call_one": lambda: sink.pid.call_one().get()},
                          total=n_small, blocks=4, warmup=100)
        one_med, _ = summary(got["call_one"])
        floor_med, _ = summary(got["floor"])
        log(f"[2] call_one small: median {one_med:.3f} ms, floor {floor_med:.3f} ms "
            f"({one_med / floor_med:.2f}x)")
        rows.append(("call_one median (ms)", one_med, floor_med, one_med / floor_med))
        # 3. peak memory of 1 GiB ------------------------------------------------------
        if not args.no_memory:
            import numpy as np

            proc_pid = sink.pid.call_one().get()
            for kind, make in (("bytes", lambda: bytes(GiB)), ("numpy", lambda: np.zeros(GiB, np.uint8))):
                big = make()
                sampler = PeakRss([os.getpid(), proc_pid])
                t0 = time.perf_counter()
                assert sink.take.call_one(big).get() == GiB
                took = time.perf_counter() - t0
                client_extra, proc_extra = sampler.stop()
                big = None
                log(f"[3] 1 GiB {kind} client->actor in {took:.2f} s: peak RSS above baseline "
                    f"client {client_extra / GiB:.2f} GiB, actor's proc {proc_extra / GiB:.2f} GiB")
                rows.append((f"1 GiB {kind} peak client (GiB over base)", client_extra / GiB, 1.2,
                             client_extra / GiB / 1.2))
                rows.append((f"1 GiB {kind} peak proc (GiB over base)", proc_extra / GiB, 1.2,
                             proc_extra / GiB / 1.2))
        # 5. RDMA 1 GiB actor -> actor, against memcpy ----------------------------------
        from monarch_nb.rdma import get_rdma_backend

        procs2 = this_host().spawn_procs(per_host={"gpus": 1}, name="bench_dataplane_reader")
        reader = procs2.spawn("reader", Sink)
        handle = sink.own.call_one(GiB).get(timeout=120)
        reads, copies = reader.pull.call_one(handle, reps).get(timeout=600)
        rdma_s, copy_s = statistics.median(reads), statistics.median(copies)
        log(f"[5] 1 GiB RDMABuffer.read_into actor->actor ({get_rdma_backend()}): {GiB / rdma_s / 1e9:.2f} GB/s, "
            f"memcpy {GiB / copy_s / 1e9:.2f} GB/s ({copy_s / rdma_s:.2f}x)")
        rows.append(("1 GiB RDMA read actor->actor (GB/s)", GiB / rdma_s / 1e9, GiB / copy_s / 1e9, copy_s / rdma_s))
        procs2.stop()
        procs.stop()
        # 4. the shared-memory threshold ------------------------------------------------
        for size, shm_s, tcp_s in shm_threshold(reps):
            log(f"[4] {size // 1024} KiB frame to this host: shared memory {shm_s * 1e3:.3f} ms, "
                f"loopback TCP {tcp_s * 1e3:.3f} ms ({tcp_s / shm_s:.2f}x)")
            rows.append((f"{size // 1024} KiB via shm, TCP=base (ms)", shm_s * 1e3, tcp_s * 1e3, shm_s / tcp_s))
    except _OneWayDone:
        pass
    finally:
        raw.close()
        echo_floor.close()
        if procs is not None:
            from monarch_nb.client.cluster import default_cluster

            default_cluster().stop()

    return _finish(rows, home, started)


class _OneWayDone(Exception):
    """--one-way: figure 1 is done."""


def _finish(rows: list, home: str, started: float) -> int:
    leftovers = leftover_processes(home)
    log(f"    leftover processes: {len(leftovers)}; total bench time {time.perf_counter() - started:.1f} s")
    for line in leftovers:
        log(f"    LEFTOVER {line}")
    log("")
    width = max(len(r[0]) for r in rows)
    log(f"{'figure'.ljust(width)}  {'value':>8}  {'baseline':>8}  {'ratio':>6}")
    for name, value, base, ratio in rows:
        log(f"{name.ljust(width)}  {value:8.3f}  {base:8.3f}  {ratio:5.2f}x")
    log("baselines: one way = raw pyzmq DEALER/ROUTER + cloudpickle (in-band) to another process, "
        "interleaved; call_one = raw zmq + cloudpickle echo, interleaved; memory = the 1.2 GiB target")
    return 1 if leftovers else 0


if __name__ == "__main__":
    sys.exit(main())
