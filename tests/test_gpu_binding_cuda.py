"""One GPU per rank on real GPUs: discovery by NVML or nvidia-smi, binding by UUID,
each rank's device, NCCL over the bound ranks, and the shared-GPU check before NCCL.
Skipped where torch sees no CUDA GPU (the CPU tests of the same paths, with a faked
inventory, are in test_gpu_binding.py)."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

from monarch_nb.actor import Actor, endpoint

from conftest import cuda_gpu_count


@pytest.fixture(scope="module")
def gpus() -> int:
    """How many CUDA GPUs this machine has (torch's count; not imported at module
    level: procs import this module for its actor classes)."""
    count = cuda_gpu_count()
    if not count:
        pytest.skip("needs a CUDA GPU: torch.cuda.is_available() is False here")
    return count


class Device(Actor):
    @endpoint
    def seen(self) -> dict:
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return {"count": torch.cuda.device_count(), "uuid": str(props.uuid),
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "local_rank": os.environ.get("LOCAL_RANK")}


class Nccl(Actor):
    def __init__(self):
        import torch.distributed as dist

        dist.init_process_group(timeout=timedelta(seconds=120))

    @endpoint
    def all_reduce(self, value: float) -> tuple[str, float]:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], device="cuda")
        dist.all_reduce(t)
        return dist.get_backend(), t.item()


def test_each_rank_owns_a_distinct_gpu_found_by_the_agent(gpus, cluster):
    host = next(h for h in cluster.health()["hosts"])
    assert len(host["gpus"]) >= gpus and all(g["name"] for g in host["gpus"])  # NVML / nvidia-smi named them
    procs = cluster.this_host().spawn_procs(per_host={"gpus": gpus}, name="cuda_bound")
    try:
        seen = procs.spawn("device", Device).seen.call().get().values()
        assert {s["count"] for s in seen} == {1}  # each sees its own GPU alone
        assert len({s["uuid"] for s in seen}) == gpus
    finally:
        procs.stop()


def test_nccl_all_reduce_over_the_bound_ranks(gpus, cluster):
    procs = cluster.this_host().spawn_procs(per_host={"gpus": gpus}, name="cuda_nccl")
    try:
        procs.setup_torch_distributed()  # auto: NCCL here
        mesh = procs.spawn("nccl", Nccl)
        futures = [mesh.slice(gpus=r).all_reduce.call_one(float(r + 1)) for r in range(gpus)]
        total = gpus * (gpus + 1) / 2
        results = [f.get(timeout=120) for f in futures]
        assert [value for _, value in results] == [total] * gpus
        assert all("nccl" in backend for backend, _ in results)  # ("cpu:gloo,cuda:nccl" without a backend named)
    finally:
        procs.stop()


def test_two_ranks_on_one_gpu_are_refused_before_nccl(gpus, cluster):
    procs = cluster.this_host().spawn_procs(per_host={"gpus": 2}, name="cuda_shared", gpus_per_proc=0.5)
    try:
        with pytest.raises(ValueError, match="ranks 0, 1 would share one GPU"):
            procs.setup_torch_distributed()
    finally:
        procs.stop()
