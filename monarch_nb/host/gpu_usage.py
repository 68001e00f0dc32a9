"""GPU memory each proc of a host uses, as NVML (``nvidia-ml-py``'s ``pynvml``) counts
it per process, for the host agent's status poll; torch is never imported.

Without ``pynvml``, or without a driver, it says nothing (``{}``), and never tries
again. A process in a PID namespace other than the driver's (some containers) is not
matched: NVML gives the pids it sees.
"""

from __future__ import annotations

from typing import Any

from ..protocol import gpus as proto


class NvmlUsage:
    """Per-process GPU memory by NVML; NVML is started on first use and kept."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._tried = False

    def _started(self) -> Any:
        if not self._tried:
            self._tried = True
            try:
                import pynvml  # type: ignore[import-not-found]  # nvidia-ml-py, optional

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception:  # noqa: BLE001 - not installed, no library, no driver: nothing to say
                self._nvml = None
        return self._nvml

    def available(self) -> bool:
        """Whether NVML answers here (started on the first call)."""
        return self._started() is not None

    def used_by(self, pids: set[int]) -> dict[int, dict[str, int]]:
        """pid -> {GPU UUID: bytes, NVML index as a string: bytes} for those of ``pids``
        that hold memory on a GPU (``protocol.gpus.GPU_USED_BYTES``'s shape); ``{}`` when
        NVML can't tell. Blocking (a few driver calls per GPU): run it off the event loop."""
        nvml = self._started()
        if nvml is None or not pids:
            return {}
        found: dict[int, dict[str, int]] = {}
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    used = process.usedGpuMemory  # None where the driver hides it (Windows WDDM, some vGPUs)
                    if process.pid in pids and used is not None:
                        mine = found.setdefault(process.pid, {})
                        mine[uuid] = mine.get(uuid, 0) + used
                        mine[str(index)] = mine.get(str(index), 0) + used
        except Exception:  # noqa: BLE001 - a driver error mid-count: say nothing this time
            return {}
        return found


def with_usage(status: dict, used: dict[str, int] | None) -> dict:
    """``status`` (a proc's answer) with NVML's figures for it added, when there are any."""
    return {**status, proto.GPU_USED_BYTES: used} if used else status
