"""The device check of issue 25: the GPU tests, then CUDA-tensor message and RDMABuffer
figures, as JSON.

    cd /work/main && .venv/bin/python bench/gpu_check.py [--budget-s 220] [--quick] [--without-gpu]

Bounded (``--budget-s``, default 220 s: under 4 minutes on one H200), no internet. It
prints one JSON object on stdout (progress on stderr):

- ``tests``: pytest over tests/test_gpu_binding_cuda.py, tests/test_cuda_messages.py and
  tests/test_cuda_rdma.py (their GPU tests skip without CUDA): passed / failed / skipped
  counts, the summary line;
- ``figures`` (GB/s, median of the repetitions), each with the bytes it moved:
  - ``rdma_read_into_{64MiB,1GiB}_cuda_{ipc,staged}``: ``RDMABuffer.read_into`` of a CUDA
    buffer one actor owns into CUDA memory of another actor of the host, by CUDA IPC, and
    staged through the owner's pinned memory (``MONARCH_NB_RDMA_CUDA_IPC=0`` in the
    reader); ``rdma_read_into_{size}_ipc_vs_d2d_clone``: the IPC figure over this run's
    same-process device clone (issue 25's target: at least 0.3 at 1 GiB);
  - ``actor_to_actor_{64MiB,1GiB}_{auto,staged}``: a CUDA tensor passed by one actor to
    another's endpoint on one host (the receiver synchronizes its device before
    replying): ``auto``, the default (``MONARCH_NB_CUDA_IPC`` unset: by CUDA IPC, every
    receiver being on this host; issue 25's target: at least 100 GB/s at 1 GiB, under
    ``targets``), ``staged`` with ``MONARCH_NB_CUDA_IPC=0`` in the sender;
  - ``actor_to_actor_{64MiB,1GiB}_cpu``: the same bytes as a CPU tensor (the CPU path);
  - ``actor_to_actor_{64MiB,1GiB}_across_netns_{cuda,cpu}``: the same between two network
    namespaces of this machine (tests/netns.py's, a host agent in each through
    ``CommandAllocator`` as in bench/bench_multihost.py), run by a process of this script
    of its own, in at most 60 s of the budget: a CUDA tensor by the default path (staged
    through pinned host memory, the receiver being on another host; a CUDA IPC claim there
    is an error) and the same bytes as a CPU tensor, in alternating blocks;
    ``..._cuda_vs_cpu``: their ratio (issue 25's target: at least 0.8, under ``targets``);
    ``across_netns``: the namespaces, the sender's IPC claims, the part's seconds. Needs
    root and iproute2 (``bash .ci/setup.d/10-netns.sh``); without them, or with the budget
    short, under ``not_measured``;
  - ``ipc_keeper``: the sender's CUDA IPC claims, and how many fell back to bytes (should
    be 0: the receiver opened the handle); ``actor_checks``: the same for each ``auto``
    figure (an ``auto`` figure whose tensors did not go by IPC is an error);
  - floors in this process: ``d2d_clone`` (same-process device clone), ``pinned_h2d``,
    ``pinned_d2h``, ``pageable_d2h``, ``pageable_h2d`` (the staged receiver's copy, from
    the frames it received); ``torch_ipc_clone``: torch's own CUDA IPC, a tensor opened
    and cloned by a second process (torch.multiprocessing);
- ``not_measured``: what this machine could not measure, and why.

Without CUDA (or without torch) it says so on stderr and in the JSON's ``no_gpu``, runs
nothing and exits 0, importing neither monarch_nb nor torch's CUDA; ``--without-gpu``
runs the tests and the CPU path anyway, across namespaces too where they can be made (a
check of the script's plumbing).

Exit status 1 when a test failed or a figure errored (an IPC or ``auto`` figure that was
in fact staged, a figure across namespaces that went by IPC, an RDMA read that returned
wrong bytes, a namespace or process left behind). Runs in its own MONARCH_NB_HOME
(a temporary folder, removed at exit, unless one is set).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if "MONARCH_NB_HOME" not in os.environ:  # before monarch_nb loads: never the user's clusters
    os.environ["MONARCH_NB_HOME"] = tempfile.mkdtemp(prefix="monarch-nb-gpu-check-")
    atexit.register(shutil.rmtree, os.environ["MONARCH_NB_HOME"], ignore_errors=True)
IPC_ENV = "MONARCH_NB_CUDA_IPC"
MiB, GiB = 1 << 20, 1 << 30
GPU_TESTS = ["tests/test_gpu_binding_cuda.py", "tests/test_cuda_messages.py", "tests/test_cuda_rdma.py"]
RDMA_IPC_ENV = "MONARCH_NB_RDMA_CUDA_IPC"
RDMA_TARGET = 0.3  # issue 25: read_into of 1 GiB CUDA on one host >= 0.3x a same-process device clone
ACTOR_TARGET_GBPS = 100.0  # issue 25: a 1 GiB CUDA tensor actor -> actor on one host, by default
NETNS_TARGET = 0.8  # issue 25: across two network namespaces of one machine, >= 0.8x the CPU path
NETNS_SHARE_S = 60.0  # the across-namespaces figures' share of --budget-s, kept from the one-host ones
NETNS_MIN_S = 20.0  # less left than this: those figures are not started
ONE_HOST_MIN_S = 40.0  # the least the one-host actor figures keep when a share goes to the namespaces
NETNS_SUBNET = 215  # 10.215.N.0/24 (tests/test_multihost.py has 213, bench_multihost.py 214)


def log(msg: str) -> None:
    print(f"[gpu_check] {msg}", file=sys.stderr, flush=True)


def cuda_here() -> tuple[bool, str]:
    """Whether this process has a CUDA GPU, and if not why, without importing monarch_nb."""
    try:
        import torch
    except ImportError:
        return False, "no CUDA GPU here (torch is not installed)"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU here (torch.cuda.is_available() is False)"
    return True, ""


def actor_classes() -> tuple[type, type]:
    """The actors of the figures (defined here so that a run without a GPU imports no
    monarch_nb: the procs get them by value)."""
    from monarch_nb.actor import Actor, endpoint

    class Receiver(Actor):
        @endpoint
        def take(self, tensor) -> int:
            if tensor.is_cuda:
                import torch

                torch.cuda.synchronize(tensor.device)
            return tensor.numel() * tensor.element_size()

        @endpoint
        def rdma_read(self, buffer, reps: int, ipc: bool, device: str = "cuda") -> dict:
            """Seconds per ``buffer.read_into`` a tensor on ``device`` of this proc (the
            first, which maps the handle, not counted), and whether the bytes were right."""
            import torch

            from monarch_nb import rdma

            os.environ[RDMA_IPC_ENV] = "1" if ipc else "0"
            dst = torch.zeros(buffer.size(), dtype=torch.uint8, device=device)
            buffer.read_into(dst).get(timeout=120)
            correct = bool((dst.view(torch.float32) == 1.0).all())
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                buffer.read_into(dst).get(timeout=120)
                times.append(time.perf_counter() - t0)
            del dst
            torch.cuda.empty_cache()
            return {"times": times, "correct": correct, "backend": buffer.backend,
                    "unopened": rdma._mappings.unopened}

    class Sender(Actor):
        @endpoint
        def rdma_buffer(self, nbytes: int, device: str = "cuda"):
            """An RDMABuffer over ``nbytes`` of ones (float32) on ``device`` of this proc."""
            import torch

            from monarch_nb.rdma import RDMABuffer

            self.rdma_tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
            if device == "cuda":
                torch.cuda.synchronize()  # written before any reader copies it
            self.rdma = RDMABuffer(self.rdma_tensor)
            return self.rdma

        @endpoint
        def rdma_drop(self) -> None:
            import torch

            self.rdma.drop().get()
            self.rdma = self.rdma_tensor = None
            torch.cuda.empty_cache()

        @endpoint
        def ipc_counts(self) -> dict:
            """This proc's CUDA IPC keeper: claims served, and how many of them fell back to bytes."""
            from monarch_nb.wire import cuda_ipc

            return {"claims": cuda_ipc.keeper().claims, "fell_back_to_bytes": cuda_ipc.keeper().staged}

        @endpoint
        def send(self, receiver, nbytes: int, device: str, ipc: str, reps: int, warmup: bool = True) -> list[float]:
            """Seconds per call of ``receiver.take(tensor)``, ``tensor`` of ``nbytes`` on
            ``device``, with ``MONARCH_NB_CUDA_IPC=ipc`` in this proc (after one untimed
            call when ``warmup``)."""
            import torch

            os.environ[IPC_ENV] = ipc
            tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
            if warmup:  # pinned pool, shm, connections
                assert receiver.take.call_one(tensor).get(timeout=120) == nbytes
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                receiver.take.call_one(tensor).get(timeout=120)
                times.append(time.perf_counter() - t0)
            return times

    return Receiver, Sender


def run_tests(timeout_s: float) -> dict:
    cmd = [sys.executable, "-m", "pytest", *GPU_TESTS, "-q", "-rs", "-p", "no:cacheprovider"]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"pytest ran past {timeout_s:.0f} s", "passed": 0, "failed": 0, "skipped": 0}
    lines = done.stdout.strip().splitlines()
    summary = lines[-1] if lines else ""
    counts = {k: 0 for k in ("passed", "failed", "skipped", "error")}
    for part in summary.strip("= ").split(" in ")[0].split(", "):
        n, _, kind = part.partition(" ")
        kind = kind.rstrip("s") if kind.endswith("errors") else kind
        if n.isdigit() and kind in counts:
            counts[kind] = int(n)
    skips = [line for line in lines if line.startswith("SKIPPED")]
    return {**counts, "returncode": done.returncode, "summary": summary, "skips": skips[:10],
            "failures": [line for line in lines if line.startswith(("FAILED", "ERROR"))][:10]}


def gbps(nbytes: int, times: list[float]) -> float:
    return round(nbytes / statistics.median(times) / 1e9, 3)


def timed(fn, reps: int) -> list[float]:
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def floors(sizes: dict, reps: int) -> dict:
    import torch

    out = {}
    for label, n in sizes.items():
        dev = torch.ones(n // 4, device="cuda")
        pinned = torch.empty(n // 4, pin_memory=True)
        pageable = torch.empty(n // 4)
        sync = torch.cuda.synchronize
        out[f"d2d_clone_{label}"] = gbps(n, timed(lambda: (dev.clone(), sync()), reps))
        out[f"pinned_d2h_{label}"] = gbps(n, timed(lambda: (pinned.copy_(dev, non_blocking=True), sync()), reps))
        out[f"pinned_h2d_{label}"] = gbps(n, timed(lambda: (dev.copy_(pinned, non_blocking=True), sync()), reps))
        out[f"pageable_d2h_{label}"] = gbps(n, timed(lambda: (pageable.copy_(dev), sync()), reps))
        # the staged path's receiver copies from the frames it received: pageable memory
        out[f"pageable_h2d_{label}"] = gbps(n, timed(lambda: (dev.copy_(pageable), sync()), reps))
        dev = pinned = pageable = None  # freed before the next size (the lambdas' cells hold them)
        torch.cuda.empty_cache()
    return out


def _ipc_child(queue, done, reps):
    import torch

    tensor = queue.get()
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        tensor.clone()
        if tensor.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    del tensor
    done.put(times[1:])


def torch_ipc_floor(nbytes: int, reps: int, device: str = "cuda") -> float:
    """GB/s of a clone, in a second process, of a CUDA tensor it got by torch's IPC
    (the open included once, in the first, unreported clone)."""
    import torch
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_ipc_child, args=(queue, done, reps))
    child.start()
    tensor = torch.ones(nbytes // 4, device=device)
    queue.put(tensor)
    try:
        times = done.get(timeout=120)
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    return gbps(nbytes, times)


def rdma_figures(sender, receiver, sizes: dict, reps: int, deadline: float, out: dict, missing: list,
                 checks: dict) -> None:
    """``rdma_read_into_*``: a CUDA RDMABuffer of ``sender`` read into ``receiver``'s GPU."""
    for label, n in sizes.items():
        if time.monotonic() > deadline:
            missing.append(f"rdma_read_into_{label}_*: out of time (--budget-s)")
            continue
        try:
            buffer = sender.rdma_buffer.call_one(n).get(timeout=120)
        except Exception as e:  # noqa: BLE001 (reported, and the run goes on)
            out[f"rdma_read_into_{label}_cuda_ipc"] = None
            missing.append(f"rdma_read_into_{label}_*: {type(e).__name__}: {str(e)[:300]}")
            continue
        for mode, ipc in (("ipc", True), ("staged", False)):
            name = f"rdma_read_into_{label}_cuda_{mode}"
            if time.monotonic() > deadline:
                missing.append(f"{name}: out of time (--budget-s)")
                continue
            try:
                got = receiver.rdma_read.call_one(buffer, reps, ipc).get(timeout=300)
                out[name] = gbps(n, got["times"])
                checks[name] = {k: got[k] for k in ("correct", "backend", "unopened")}
                log(f"{name}: {out[name]} GB/s ({checks[name]})")
            except Exception as e:  # noqa: BLE001
                out[name] = None
                missing.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
        sender.rdma_drop.call_one().get(timeout=60)
        clone, ipc_figure = out.get(f"d2d_clone_{label}"), out.get(f"rdma_read_into_{label}_cuda_ipc")
        if clone and ipc_figure:
            out[f"rdma_read_into_{label}_ipc_vs_d2d_clone"] = round(ipc_figure / clone, 3)


def rdma_errors(checks: dict) -> list[str]:
    """What went wrong in the RDMA figures: wrong bytes, or an IPC read that was staged."""
    errors = []
    for name, check in checks.items():
        if not check["correct"]:
            errors.append(f"{name}: the bytes read were wrong")
        if name.endswith("_ipc") and (check["backend"] != "cuda_ipc" or check["unopened"]):
            errors.append(f"{name}: went staged, not by CUDA IPC ({check})")
    return errors


def actor_errors(actor_checks: dict) -> list[str]:
    """What went wrong in the ``auto`` figures: tensors that went staged, not by CUDA IPC."""
    errors = []
    for name, check in actor_checks.items():
        if not check["claims"] or check["fell_back_to_bytes"]:
            errors.append(f"{name}: not (only) by CUDA IPC, as the default should be on one host "
                          f"(the sender's keeper in that figure: {check})")
    return errors


def actor_figures(sizes: dict, cuda: bool, reps: int, deadline: float, out: dict, missing: list,
                  checks: dict, actor_checks: dict) -> None:
    from monarch_nb.client.cluster import Cluster

    Receiver, Sender = actor_classes()
    cluster = Cluster.start_ephemeral()
    try:
        procs = cluster.this_host().spawn_procs(per_host={"procs": 2}, name="gpu_check")  # both see the GPUs
        sender, receiver = procs.spawn("sender", Sender).slice(procs=0), procs.spawn("receiver", Receiver).slice(procs=1)
        if cuda:
            log("RDMABuffer read_into")
            rdma_figures(sender, receiver, sizes, reps, deadline, out, missing, checks)
        log("actor -> actor")
        # (figure, device, MONARCH_NB_CUDA_IPC in the sender): the default, and staging forced
        modes = [("cpu", "cpu", "auto")] + ([("staged", "cuda", "0"), ("auto", "cuda", "auto")] if cuda else [])
        for label, n in sizes.items():
            for mode, device, ipc in modes:
                name = f"actor_to_actor_{label}_{mode}"
                if time.monotonic() > deadline:
                    missing.append(f"{name}: out of time (--budget-s)")
                    continue
                try:
                    before = sender.ipc_counts.call_one().get(timeout=60) if device == "cuda" else None
                    times = sender.send.call_one(receiver, n, device, ipc, reps).get(timeout=300)
                    out[name] = gbps(n, times)
                    log(f"{name}: {out[name]} GB/s")
                    if before is not None and mode == "auto":
                        after = sender.ipc_counts.call_one().get(timeout=60)
                        actor_checks[name] = {k: after[k] - before[k] for k in after}
                except Exception as e:  # noqa: BLE001 (reported, and the run goes on)
                    out[name] = None
                    missing.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
        if cuda:
            out["ipc_keeper"] = sender.ipc_counts.call_one().get(timeout=60)
        procs.stop()
    finally:
        cluster.stop()


def netns_unavailable() -> str:
    """Why two network namespaces can't be made here (empty when they may be): checked
    before the one-host figures, so that no share of the budget is kept for nothing."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's `ip` (bash .ci/setup.d/10-netns.sh)"
    return ""


def _left_running(marker: str, wait_s: float = 5.0) -> list[int]:
    """Pids of processes (not this one) whose command line mentions ``marker`` (a cluster's
    directory), after giving them up to ``wait_s`` to go."""
    import psutil

    give_up = time.monotonic() + wait_s
    while True:
        left = [p.pid for p in psutil.process_iter(["cmdline"])
                if p.pid != os.getpid() and marker in " ".join(p.info["cmdline"] or [])
                and p.status() != psutil.STATUS_ZOMBIE]
        if not left or time.monotonic() > give_up:
            return left
        time.sleep(0.1)


def across_netns_figures(sizes: dict, cuda: bool, reps: int, deadline: float, out: dict, missing: list,
                         errors: list, report: dict) -> None:
    """``actor_to_actor_{size}_across_netns_{cuda,cpu}``: a tensor passed by an actor in one
    network namespace to an actor's endpoint in another (two hosts of one machine, as
    bench/bench_multihost.py makes them: tests/netns.py's namespaces, a host agent in each
    through ``CommandAllocator``), CUDA (the default path: staged, the receiver being on
    another host) and CPU in alternating blocks, and their ratio. Namespaces that can't be
    made go to ``missing``; a network or process left behind, or a CUDA tensor that went by
    IPC, to ``errors``."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from netns import NamespacesUnavailable, bridged_namespaces

    try:
        with bridged_namespaces(NETNS_SUBNET, "mnbg") as (root, ips, spaces):
            report.update(namespaces=spaces, addresses=ips)
            _across_netns(root, spaces, sizes, cuda, reps, deadline, out, missing, errors, report)
    except NamespacesUnavailable as e:
        missing.append(f"actor_to_actor_*_across_netns_*: no network namespaces here: {e}")
    except (subprocess.SubprocessError, OSError) as e:  # made in part, and removed again
        missing.append(f"actor_to_actor_*_across_netns_*: making the namespaces failed: "
                       f"{getattr(e, 'stderr', '') or e}")
    except RuntimeError as e:  # only bridged_namespaces' own check: _across_netns reports its errors
        errors.append(f"across_netns: {e}")


def _across_netns(root: str, spaces: list[str], sizes: dict, cuda: bool, reps: int, deadline: float,
                  out: dict, missing: list, errors: list, report: dict) -> None:
    from monarch_nb.allocators.command import CommandAllocator
    from monarch_nb.client.cluster import Cluster

    modes = ["cpu", "cuda"] if cuda else ["cpu"]
    per_block = max(1, (reps + 1) // 2)  # two blocks a mode, orders alternating
    try:
        cluster = Cluster.start_ephemeral(allocator=CommandAllocator(
            [["ip", "netns", "exec", ns] for ns in spaces], bind=root))
    except Exception as e:  # noqa: BLE001 (reported, and the run goes on)
        missing.append(f"actor_to_actor_*_across_netns_*: the cluster across namespaces did not start: "
                       f"{type(e).__name__}: {str(e)[:300]}")
        return
    try:
        Receiver, Sender = actor_classes()
        try:
            # "procs", not "gpus": unbound, each proc sees every GPU (two hosts of one machine would share its one GPU)
            procs = cluster.host_mesh().spawn_procs(per_host={"procs": 1}, name="gpu_check_netns")
            sender = procs.spawn("sender", Sender).slice(hosts=0)
            receiver = procs.spawn("receiver", Receiver).slice(hosts=1)
        except Exception as e:  # noqa: BLE001
            out.update({f"actor_to_actor_{label}_across_netns_{mode}": None for label in sizes for mode in modes})
            missing.append(f"actor_to_actor_*_across_netns_*: spawning across namespaces failed: "
                           f"{type(e).__name__}: {str(e)[:300]}")
            return
        seconds_per_byte = 0.0  # of the last size measured: how long the next one should take
        for label, n in sizes.items():
            names = {mode: f"actor_to_actor_{label}_across_netns_{mode}" for mode in modes}
            expected = seconds_per_byte * n * len(modes) * (2 * per_block + 1)
            if time.monotonic() + expected > deadline:
                missing.append(f"{', '.join(names.values())}: out of time (their share of --budget-s; "
                               f"~{expected:.0f} s expected)")
                continue
            try:
                before = sender.ipc_counts.call_one().get(timeout=60) if cuda else None
                times: dict[str, list[float]] = {mode: [] for mode in modes}
                for block in range(2):
                    for mode in (modes if block == 0 else modes[::-1]):
                        times[mode] += sender.send.call_one(receiver, n, mode, "auto", per_block,
                                                            warmup=block == 0).get(timeout=300)
            except Exception as e:  # noqa: BLE001
                out.update({name: None for name in names.values()})
                missing.append(f"{label} across namespaces: {type(e).__name__}: {str(e)[:300]}")
                continue
            for mode, name in names.items():
                out[name] = gbps(n, times[mode])
                log(f"{name}: {out[name]} GB/s")
            seconds_per_byte = max(statistics.median(t) for t in times.values()) / n
            if cuda:
                after = sender.ipc_counts.call_one().get(timeout=60)
                counts = report[f"{label}_sender_ipc"] = {k: after[k] - before[k] for k in after}
                if counts["claims"]:
                    errors.append(f"{names['cuda']}: went by CUDA IPC ({counts}), not staged as to another "
                                  f"host: not the path across hosts")
                ratio = out[names["cuda"]] / out[names["cpu"]]
                out[f"actor_to_actor_{label}_across_netns_cuda_vs_cpu"] = round(ratio, 3)
        procs.stop()
    finally:
        cluster.stop()
        left = _left_running(str(cluster.path))
        if left:
            errors.append(f"across_netns: processes of its cluster left running: {left}")


def across_netns_in_child(budget_s: float, quick: bool) -> dict:
    """:func:`across_netns_figures` in a fresh process of this script (this one's inbox
    already listens on loopback, where procs in other namespaces can't reach it), given
    ``budget_s`` seconds; its JSON (``figures``, ``not_measured``, ``errors``,
    ``across_netns``). Past its time it gets SIGTERM, so that it removes its namespaces
    and cluster, and SIGKILL 30 s later."""
    cmd = [sys.executable, os.path.abspath(__file__), "--only-across-netns", "--budget-s", f"{budget_s:.0f}"]
    child = subprocess.Popen(cmd + (["--quick"] if quick else []), cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        stdout, _ = child.communicate(timeout=budget_s + 30)
    except BaseException as e:  # its time is up, or this one is stopped (SIGTERM, Ctrl-C): it cleans up first
        child.terminate()
        try:
            child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        tag = f"mnbg{child.pid % 10_000_000}"  # tests/netns.py's names
        left = [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if n.startswith(tag)]
        return {"errors": [f"across_netns: its process ran past {budget_s + 30:.0f} s and was stopped "
                           f"(exit status {child.returncode}); namespaces left: {left or 'none'}"]}
    try:
        return json.loads(stdout)
    except ValueError:
        return {"errors": [f"across_netns: its process ended with status {child.returncode} and no JSON: "
                           f"{stdout[-300:]!r}"]}


def _sigterm(signum, frame):
    raise SystemExit(128 + signum)  # through every finally: the namespaces and clusters go too


def main() -> int:
    signal.signal(signal.SIGTERM, _sigterm)
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget-s", type=float, default=220.0)
    parser.add_argument("--quick", action="store_true", help="64 MiB only, 2 repetitions")
    parser.add_argument("--without-gpu", action="store_true",
                        help="without CUDA, run the tests and the CPU path anyway (the script's plumbing)")
    parser.add_argument("--only-across-netns", action="store_true",
                        help="(run by this script) only the figures across network namespaces, as JSON")
    args = parser.parse_args()
    started = time.monotonic()
    deadline = started + args.budget_s
    reps = 2 if args.quick else 5
    sizes = {"64MiB": 64 * MiB} if args.quick else {"64MiB": 64 * MiB, "1GiB": GiB}
    if args.only_across_netns:
        part: dict = {"figures": {}, "not_measured": [], "errors": [], "across_netns": {}}
        across_netns_figures(sizes, cuda_here()[0], reps, deadline, part["figures"], part["not_measured"],
                             part["errors"], part["across_netns"])
        print(json.dumps(part))
        return 0
    result: dict = {"host": platform.node(), "python": platform.python_version()}
    cuda, why = cuda_here()
    torch = sys.modules.get("torch")
    result["torch"] = getattr(torch, "__version__", None)
    result["device"] = torch.cuda.get_device_name(0) if cuda else None
    if not cuda and not args.without_gpu:
        log(f"{why}: nothing to check; run this on a GPU machine (--without-gpu runs the tests and the CPU path anyway)")
        result.update(no_gpu=why, not_measured=["everything: " + why])
        print(json.dumps(result, indent=1))
        return 0
    missing: list[str] = []
    figures: dict = {}
    checks: dict = {}
    actor_checks: dict = {}
    log("running the GPU tests")
    result["tests"] = run_tests(timeout_s=min(120.0, args.budget_s * 0.5))
    failed = bool(result["tests"].get("failed") or result["tests"].get("error") or result["tests"]["returncode"] not in (0, 5))
    if not cuda:
        result["no_gpu"] = why
        missing.append(f"every CUDA figure (rdma_read_into, actor_to_actor staged and auto, d2d_clone, pinned_h2d/d2h, torch_ipc_clone): {why}")
    else:
        log("floors")
        figures.update(floors(sizes, reps))
        for label, n in sizes.items():
            if time.monotonic() < deadline:
                try:
                    figures[f"torch_ipc_clone_{label}"] = torch_ipc_floor(n, reps)
                except Exception as e:  # noqa: BLE001
                    missing.append(f"torch_ipc_clone_{label}: {type(e).__name__}: {e}")
    # The figures across namespaces get their share of what is left when the one-host
    # figures still have ONE_HOST_MIN_S beside it; else those go first and these are not measured.
    no_netns = "torch is not installed" if torch is None else netns_unavailable()
    if not no_netns and deadline - time.monotonic() < NETNS_SHARE_S + ONE_HOST_MIN_S:
        no_netns = (f"out of time (under {NETNS_SHARE_S + ONE_HOST_MIN_S:.0f} s of --budget-s left "
                    f"for the actor figures)")
    across: dict = {}
    errors: list[str] = []
    if torch is not None:
        actor_figures(sizes, cuda, reps, deadline - (0 if no_netns else NETNS_SHARE_S), figures, missing,
                      checks, actor_checks)
    else:
        missing.append("actor_to_actor_*: torch is not installed")
    if not cuda:
        missing.append(f"actor_to_actor_*_across_netns_cuda: {why}")
    if no_netns:
        missing.append(f"actor_to_actor_*_across_netns_*: {no_netns}")
    elif deadline - time.monotonic() < NETNS_MIN_S:
        missing.append(f"actor_to_actor_*_across_netns_*: out of time (under {NETNS_MIN_S:.0f} s of --budget-s left)")
    else:
        log("actor -> actor across two network namespaces")
        netns_started = time.monotonic()
        netns_part = across_netns_in_child(min(NETNS_SHARE_S, deadline - time.monotonic()), args.quick)
        across["seconds"] = round(time.monotonic() - netns_started, 1)
        figures.update(netns_part.get("figures", {}))
        missing += netns_part.get("not_measured", [])
        errors += netns_part.get("errors", [])
        across.update(netns_part.get("across_netns", {}))
    result["figures"] = figures
    result["rdma_checks"] = checks
    result["actor_checks"] = actor_checks
    result["across_netns"] = across
    ratio = figures.get("rdma_read_into_1GiB_ipc_vs_d2d_clone")
    result["targets"] = {"rdma_read_into_1GiB_ipc_vs_d2d_clone": {"value": ratio, "at_least": RDMA_TARGET,
                                                                  "met": None if ratio is None else ratio >= RDMA_TARGET}}
    actor_gbps = figures.get("actor_to_actor_1GiB_auto")
    result["targets"]["actor_to_actor_1GiB_auto"] = {
        "value": actor_gbps, "at_least_gbps": ACTOR_TARGET_GBPS,
        "met": None if actor_gbps is None else actor_gbps >= ACTOR_TARGET_GBPS}
    for label in sizes:
        name = f"actor_to_actor_{label}_across_netns_cuda_vs_cpu"
        value = figures.get(name)
        result["targets"][name] = {"value": value, "at_least": NETNS_TARGET,
                                   "met": None if value is None else value >= NETNS_TARGET}
    errors += rdma_errors(checks) + actor_errors(actor_checks)
    result["not_measured"] = missing + errors
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=1))
    errored = any(v is None for v in figures.values()) or bool(figures.get("ipc_keeper", {}).get("fell_back_to_bytes"))
    return 1 if failed or errored or errors else 0


if __name__ == "__main__":
    sys.exit(main())
