"""What GPUs a process sees, read from ``CUDA_VISIBLE_DEVICES`` without importing
torch, and the one place a proc asks torch about CUDA (``cuda_report``, ``set_device``).

``CUDA_VISIBLE_DEVICES`` is read as CUDA reads it: a comma-separated list of device
indices (``"3,5"``) or UUIDs (``"GPU-8c1b..."``, ``"MIG-..."``); CUDA stops at the first
entry it can't parse, so ``"-1"``, ``"NoDevFiles"`` (what Slurm sets for a job without
GPUs) and ``""`` mean no GPU at all. Unset means every GPU of the machine.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from ..protocol import gpus as proto

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
# What makes a machine's NVIDIA GPUs reachable from a process: the driver's control device.
NVIDIA_CONTROL_DEVICE = "/dev/nvidiactl"


def visible_devices(value: str | None) -> list[str] | None:
    """The device ids ``CUDA_VISIBLE_DEVICES=value`` names, in order: ``"3,5"`` ->
    ``["3", "5"]``; ``None`` when unset (every GPU of the machine); ``[]`` when it hides
    them all (``""``, ``"-1"``, ``"NoDevFiles"``). Entries after the first one CUDA can't
    parse are dropped, as CUDA drops them."""
    if value is None:
        return None
    ids: list[str] = []
    for part in value.split(","):
        part = part.strip()
        if part.isdigit() or part.startswith(("GPU-", "MIG-")):
            ids.append(part)
        else:
            break
    return ids


def device_for(visible: list[str] | None, local_rank: int, count: int) -> int:
    """The CUDA device index a rank should use: 0 when its ``CUDA_VISIBLE_DEVICES``
    names one GPU (bound to it by ``spawn_procs``), else its local rank modulo the
    ``count`` devices it sees (torchrun's layout, every GPU visible). Raises
    ``ValueError`` when ``count`` is not positive."""
    if count < 1:
        raise ValueError(f"no CUDA device to choose from (count={count})")
    if visible is not None and len(visible) == 1:
        return 0
    return local_rank % count


def cuda_likely() -> bool:
    """Whether CUDA could work here, without importing torch: torch is installed (or
    loaded) and a GPU is visible (``CUDA_VISIBLE_DEVICES`` names one, or is unset on a
    machine with the NVIDIA driver's devices)."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return False
    visible = visible_devices(os.environ.get(VISIBLE_ENV))
    return bool(visible) if visible is not None else os.path.exists(NVIDIA_CONTROL_DEVICE)


def cuda_report(local_rank: int) -> dict | None:
    """The CUDA device this rank would use, as ``{device, uuid, name, visible}``
    (``protocol.gpus`` keys), or ``None`` when there is none. Imports torch only when
    :func:`cuda_likely` says CUDA could work: a CPU machine never loads it here."""
    if not cuda_likely():
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    visible = visible_devices(os.environ.get(VISIBLE_ENV))
    device = device_for(visible, local_rank, torch.cuda.device_count())
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)  # (older torch: the machine and the id the rank sees it by)
    where = visible[device] if visible and device < len(visible) else str(device)
    return {proto.CUDA_DEVICE: device, proto.CUDA_UUID: str(uuid) if uuid else f"{os.uname().nodename}:{where}",
            proto.CUDA_NAME: props.name, proto.CUDA_VISIBLE: os.environ.get(VISIBLE_ENV)}


def cuda_in_use() -> dict | None:
    """The CUDA memory this proc uses, as torch's caching allocator holds it on the
    current device: ``{device, name, used_bytes}`` (``protocol.gpus`` keys; ``device``
    is its index among the GPUs this proc sees), or ``None`` unless torch is already
    imported and CUDA already initialised here. Never imports torch nor initialises
    CUDA (a status request must not cost a proc a CUDA context, ~500 MiB), never raises."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return None
        device = cuda.current_device()
        return {proto.CUDA_DEVICE: device, proto.CUDA_NAME: cuda.get_device_properties(device).name,
                proto.USED_BYTES: int(cuda.memory_reserved(device))}
    except Exception:  # noqa: BLE001 - a driver error: the status goes without it
        return None


def set_device(device: int) -> None:
    """Make ``device`` this process's current CUDA device (torch's, so that ``"cuda"``
    tensors and NCCL use it)."""
    import torch

    torch.cuda.set_device(device)
