"""Each proc's GPU in the health tree (issue 25 item 1): its index, name and the memory it
uses there, from NVML in its host agent or from torch in the proc where CUDA is already
up; never by importing torch or initialising CUDA for a status. Fast tier: no processes
(NVML and torch are stand-ins)."""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

from monarch_nb.health_view import gpus_text, to_html, to_plain
from monarch_nb.host.gpu_usage import NvmlUsage
from monarch_nb.host.status_poll import StatusPoll
from monarch_nb.hub.gpu_binding import in_use
from monarch_nb.proc.gpus import cuda_in_use
from monarch_nb.protocol import gpus as proto

GIB = 2**30
H100 = {proto.INDEX: 3, proto.ID: "GPU-aaaa", proto.NAME: "NVIDIA H100 80GB HBM3", proto.MEMORY_MIB: 81559}
FAKE = {proto.INDEX: 5, proto.ID: "5", proto.NAME: None, proto.MEMORY_MIB: None}  # CUDA_VISIBLE_DEVICES=5, no NVML


def _tree(proc_extra: dict) -> dict:
    proc = {"proc_id": "train/0", "proc_mesh": "train", "rank": 0, "pid": 42, "state": "healthy", "cause": None,
            "actors": [], "uptime_s": 5.0, "rss_bytes": 2**20, **proc_extra}
    return {"cluster": "c", "state": "healthy", "summary": "1/1 procs healthy", "counts": {}, "actor_meshes": [],
            "services": [], "starting": [],
            "hosts": [{"host_id": "host0", "hostname": "h", "node": None, "pid": 7, "state": "healthy",
                       "cause": None, "dropped_frames": 0, "gpus": [H100], "procs": [proc]}]}


def test_a_proc_line_shows_its_gpu_index_model_and_memory_used_in_every_rendering():
    tree = _tree({"gpus": [H100], proto.GPU_USED_BYTES: {"GPU-aaaa": int(12.1 * GIB)}})
    line = next(line for line in to_plain(tree).splitlines() if "train/0" in line)
    assert "GPU 3 · H100 80GB HBM3 · 12.1 GiB used" in line
    assert "GPU 3 · H100 80GB HBM3 · 12.1 GiB used" in to_html(tree)
    from rich.console import Console
    from monarch_nb.health_view import to_rich

    console = Console(width=200, record=True, color_system=None)
    console.print(to_rich(tree))
    assert "GPU 3 · H100 80GB HBM3 · 12.1 GiB used" in console.export_text()


def test_without_a_memory_figure_the_gpu_shows_its_index_alone_and_several_gpus_sum():
    assert gpus_text([FAKE]) == "GPU 5"
    two = [H100, {**H100, proto.INDEX: 4, proto.ID: "GPU-bbbb"}]
    assert gpus_text(two, {"GPU-aaaa": GIB, "GPU-bbbb": 2 * GIB}) == "GPUs 3, 4 · H100 80GB HBM3 · 3.0 GiB used"


def test_nvml_figures_match_a_gpu_by_uuid_or_by_index_and_torch_names_an_unnamed_one():
    gpus, used = in_use([H100], {proto.GPU_USED_BYTES: {"GPU-aaaa": 7, "3": 7}})
    assert gpus == [H100] and used == {"GPU-aaaa": 7}
    gpus, used = in_use([FAKE], {proto.GPU_USED_BYTES: {"GPU-zzzz": 9, "5": 9}})
    assert used == {"5": 9}
    # no NVML: the proc's torch (CUDA up there) gives its device 0, the GPU it is bound to
    gpus, used = in_use([FAKE], {proto.STATUS_CUDA: {proto.CUDA_DEVICE: 0, proto.CUDA_NAME: "NVIDIA H200",
                                                     proto.USED_BYTES: 11}})
    assert gpus[0][proto.NAME] == "NVIDIA H200" and used == {"5": 11}
    assert FAKE[proto.NAME] is None  # the inventory's record is not changed
    assert in_use([FAKE], {"rss_bytes": 1}) == ([FAKE], {})  # neither: no memory figure at all


class _Cuda:
    def __init__(self, initialized: bool):
        self.initialized = initialized
        self.calls: list[str] = []

    def is_initialized(self) -> bool:
        return self.initialized

    def current_device(self) -> int:
        self.calls.append("current_device")
        return 0

    def get_device_properties(self, device):
        self.calls.append("get_device_properties")
        return SimpleNamespace(name="NVIDIA H100")

    def memory_reserved(self, device) -> int:
        self.calls.append("memory_reserved")
        return 3 * GIB


def test_a_proc_reports_cuda_memory_only_where_cuda_is_already_initialised(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert cuda_in_use() is None and "torch" not in sys.modules  # torch not imported: not imported for it
    idle = _Cuda(initialized=False)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=idle))
    assert cuda_in_use() is None and idle.calls == []  # nothing that would start CUDA was called
    up = _Cuda(initialized=True)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=up))
    assert cuda_in_use() == {proto.CUDA_DEVICE: 0, proto.CUDA_NAME: "NVIDIA H100", proto.USED_BYTES: 3 * GIB}


class _Net:
    async def request(self, address, header, timeout):
        return SimpleNamespace(header={"actors": {}, "rss_bytes": 1})


class _Nvml(NvmlUsage):
    def __init__(self, usage: dict | None):
        super().__init__()
        self.usage = usage
        self.asked: list[set] = []

    def available(self) -> bool:
        return self.usage is not None

    def used_by(self, pids):
        self.asked.append(pids)
        return self.usage or {}


def test_the_agent_adds_nvml_memory_to_the_status_of_the_proc_with_that_pid():
    nvml = _Nvml({101: {"GPU-aaaa": 5, "3": 5}})
    poll = StatusPoll(_Net(), {"m/0": "tcp://p0", "m/1": "tcp://p1"}, lambda: {"m/0": 101, "m/1": 102}, nvml)
    asyncio.run(poll.ask_all())
    heard = poll.take()
    assert heard["m/0"][1][proto.GPU_USED_BYTES] == {"GPU-aaaa": 5, "3": 5}
    assert proto.GPU_USED_BYTES not in heard["m/1"][1] and nvml.asked == [{101, 102}]


def test_without_nvml_the_agent_adds_nothing_and_asks_nothing():
    nvml = _Nvml(None)
    poll = StatusPoll(_Net(), {"m/0": "tcp://p0"}, lambda: {"m/0": 101}, nvml)
    asyncio.run(poll.ask_all())
    assert proto.GPU_USED_BYTES not in poll.take()["m/0"][1] and nvml.asked == []


def test_nvml_usage_without_pynvml_says_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # what `import pynvml` meets where it is not installed
    usage = NvmlUsage()
    assert not usage.available() and usage.used_by({1}) == {}
