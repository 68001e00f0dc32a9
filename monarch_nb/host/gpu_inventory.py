"""A host's GPUs, as its host agent reports them to the hub when it registers.

The inventory is the ``CUDA_VISIBLE_DEVICES`` the agent was started with, when set (as
Slurm's gres and most launchers set it; also how tests fake GPUs on a CPU machine),
else what NVML (``nvidia-ml-py``'s ``pynvml``, when installed) or ``nvidia-smi``
report; none of them: no GPUs. torch is never imported (an agent stays light).

Each GPU is a record of ``protocol.gpus`` keys: ``index`` (NVML's, when known), ``id``
(what ``CUDA_VISIBLE_DEVICES`` should say to select it), ``name`` and ``memory_mib``
(when NVML or nvidia-smi could say). GPUs found by NVML or nvidia-smi get their UUID
as ``id``: CUDA numbers devices fastest-first unless told ``CUDA_DEVICE_ORDER=PCI_BUS_ID``,
so an NVML index could select another GPU; a UUID can't.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping

from ..proc.gpus import VISIBLE_ENV, visible_devices
from ..protocol import gpus as proto

SMI_TIMEOUT_S = 10.0  # nvidia-smi on a machine whose driver hangs: give up, report no GPUs
SMI_QUERY = ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"]


def gpu(index: int | None, id_: str, name: str | None = None, memory_mib: int | None = None) -> dict:
    """One GPU record."""
    return {proto.INDEX: index, proto.ID: id_, proto.NAME: name, proto.MEMORY_MIB: memory_mib}


def parse_smi(text: str) -> list[dict]:
    """GPU records from nvidia-smi's ``index, uuid, name, memory.total`` CSV lines
    (``--format=csv,noheader,nounits``; memory in MiB); lines that don't parse are skipped."""
    found = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        memory = parts[3].split()[0] if parts[3] else ""
        found.append(gpu(int(parts[0]), parts[1], parts[2] or None, int(memory) if memory.isdigit() else None))
    return found


def from_nvidia_smi(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> list[dict] | None:
    """The machine's GPUs by nvidia-smi, or ``None`` when it is not installed or fails."""
    if shutil.which(SMI_QUERY[0]) is None:
        return None
    try:
        done = run(SMI_QUERY, capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_smi(done.stdout) if done.returncode == 0 else None


def from_nvml() -> list[dict] | None:
    """The machine's GPUs by NVML, or ``None`` when ``pynvml`` is not installed or NVML
    does not start (no driver)."""
    try:
        import pynvml  # type: ignore[import-not-found]  # nvidia-ml-py, optional
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded...: no GPUs by NVML
        return None
    try:
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name, uuid = pynvml.nvmlDeviceGetName(handle), pynvml.nvmlDeviceGetUUID(handle)
            name, uuid = (v.decode() if isinstance(v, bytes) else v for v in (name, uuid))
            found.append(gpu(i, uuid, name, pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20))
        return found
    except Exception:  # noqa: BLE001 - a GPU NVML can't describe: report what the driver tells nvidia-smi
        return None
    finally:
        pynvml.nvmlShutdown()


def _named(listed: list[str], machine: list[dict] | None) -> list[dict]:
    """Records for the ids ``CUDA_VISIBLE_DEVICES`` lists, with index, name and memory
    where the ``machine``'s GPUs (NVML's) say them."""
    by_id = {}
    for g in machine or []:
        by_id[str(g[proto.INDEX])] = g
        by_id[g[proto.ID]] = g
    found = []
    for id_ in listed:
        known = by_id.get(id_)
        index = known[proto.INDEX] if known else int(id_) if id_.isdigit() else None
        found.append(gpu(index, id_, known[proto.NAME] if known else None, known[proto.MEMORY_MIB] if known else None))
    return found


def machine_gpus() -> tuple[list[dict], str] | None:
    """The machine's GPUs and who counted them (NVML, else nvidia-smi), or ``None``."""
    for source, count in (("nvml", from_nvml), ("nvidia-smi", from_nvidia_smi)):
        found = count()
        if found:
            return found, source
    return None


def discover(environ: Mapping[str, str] = os.environ,
             machine: Callable[[], tuple[list[dict], str] | None] = machine_gpus) -> tuple[list[dict], str]:
    """This host's GPUs and where they came from: ``"CUDA_VISIBLE_DEVICES"``,
    ``"nvml"``, ``"nvidia-smi"`` or ``"none"``.

    ``environ``'s ``CUDA_VISIBLE_DEVICES``, when set, lists them (``""``, ``"-1"``:
    none), named by what ``machine()`` says of them; unset, ``machine()`` (NVML, else
    nvidia-smi) lists them. Never raises: a machine whose GPUs can't be counted reports
    none."""
    listed = visible_devices(environ.get(VISIBLE_ENV))
    if listed is not None:
        counted = machine() if listed else None
        return _named(listed, counted[0] if counted else None), VISIBLE_ENV
    return machine() or ([], "none")
