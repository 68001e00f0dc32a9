"""One GPU per rank: procs of a ``"gpus"`` dimension get their host's GPU at their
place on it (``CUDA_VISIBLE_DEVICES``) and torch elastic's RANK/LOCAL_RANK/WORLD_SIZE;
a host's GPUs are faked here with the ``CUDA_VISIBLE_DEVICES`` its host agent starts
with, so all of it runs on a CPU machine."""

from __future__ import annotations

import os

import pytest

from monarch_nb.actor import Actor, endpoint
from monarch_nb.client.cluster import Cluster
from monarch_nb.health_view import to_plain
from monarch_nb.host import gpu_inventory
from monarch_nb.hub import gpu_binding
from monarch_nb.proc import gpus as proc_gpus
from monarch_nb.client import torch_env
from monarch_nb.mesh import Extent
from monarch_nb.spmd import SPMDActor, setup_torch_elastic_env

from conftest import cluster_processes, wait_until

KEYS = ("CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


class EnvReader(Actor):
    @endpoint
    def read(self) -> dict:
        return {k: os.environ.get(k) for k in KEYS}


def _envs(procs) -> list[dict]:
    return procs.spawn("env", EnvReader).read.call().get().values()


def _start_with_gpus(visible: str, hosts: int = 1) -> Cluster:
    """A cluster whose host agents start with CUDA_VISIBLE_DEVICES=``visible`` (a fake
    inventory, as Slurm's gres would give it); this process's environment is restored."""
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    try:
        return Cluster.start_ephemeral(hosts=hosts)
    finally:
        if saved is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def _stop(c: Cluster) -> None:
    c.stop()
    assert wait_until(lambda: not cluster_processes(c.path), 10), cluster_processes(c.path)


@pytest.fixture(scope="module")
def gpu_cluster():
    """One host agent with CUDA_VISIBLE_DEVICES=3,5,6,7: a host of 4 GPUs."""
    c = _start_with_gpus("3,5,6,7")
    yield c
    _stop(c)


def test_each_proc_of_a_gpus_dimension_sees_only_its_own_gpu(gpu_cluster):
    procs = gpu_cluster.this_host().spawn_procs(per_host={"gpus": 4}, name="bound")
    try:
        envs = _envs(procs)
        assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["3", "5", "6", "7"]
        assert [e["RANK"] for e in envs] == [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2", "3"]
        assert {e["WORLD_SIZE"] for e in envs} == {e["LOCAL_WORLD_SIZE"] for e in envs} == {"4"}
        procs_node = [p for h in gpu_cluster.health()["hosts"] for p in h["procs"] if p["proc_mesh"] == "bound"]
        assert [[g["index"] for g in p["gpus"]] for p in procs_node] == [[3], [5], [6], [7]]
        shown = to_plain(gpu_cluster.health()).splitlines()
        assert any(" · 4 GPUs" in line for line in shown if "host0" in line)
        assert any(" · GPU 5 · " in line for line in shown if "bound/1" in line)
    finally:
        procs.stop()


def _maps_torch(pid: int) -> bool:
    """Whether process ``pid`` has torch's native library loaded (it imported torch)."""
    with open(f"/proc/{pid}/maps") as maps:
        return any("libtorch" in line or "torch/_C" in line for line in maps)


def test_health_shows_each_bound_procs_gpu_with_no_memory_figure_without_nvml_nor_torch_in_the_agent(gpu_cluster):
    procs = gpu_cluster.this_host().spawn_procs(per_host={"gpus": 2}, name="shown")
    try:
        def watched() -> list[dict]:  # health() keeps statuses coming through the agent's heartbeat
            tree = gpu_cluster.health()
            return [p for h in tree["hosts"] for p in h["procs"] if p["proc_mesh"] == "shown"]
        assert wait_until(lambda: all("uptime_s" in p for p in watched()), 10)
        shown = watched()
        assert [[g["index"] for g in p["gpus"]] for p in shown] == [[3], [5]]
        # fake GPUs: nothing uses memory on them, so neither NVML nor torch gives a figure
        assert all("gpu_used_bytes" not in p for p in shown)
        lines = [line for line in to_plain(gpu_cluster.health()).splitlines() if "shown/" in line]
        assert any(" · GPU 3 · " in line for line in lines) and any(" · GPU 5 · " in line for line in lines)
        assert not any("used" in line for line in lines)
        agent_pid = gpu_cluster.health()["hosts"][0]["pid"]
        assert not _maps_torch(agent_pid), "the host agent imported torch"
    finally:
        procs.stop()


def test_more_procs_than_gpus_is_refused_before_any_proc_starts_and_the_cluster_stays_usable(gpu_cluster):
    host = gpu_cluster.this_host()
    with pytest.raises(ValueError, match=r"5 procs on host .*4 GPUs \(3, 5, 6, 7\).*gpus_per_proc.*bind_gpus=False"):
        host.spawn_procs(per_host={"gpus": 5}, name="toomany")
    assert "toomany" not in gpu_cluster.proc_meshes
    assert not [p for h in gpu_cluster.health()["hosts"] for p in h["procs"] if p["proc_mesh"] == "toomany"]
    procs = host.spawn_procs(per_host={"gpus": 2}, name="after")
    try:
        assert [e["CUDA_VISIBLE_DEVICES"] for e in _envs(procs)] == ["3", "5"]
    finally:
        procs.stop()


def test_procs_may_share_gpus_or_take_several(gpu_cluster):
    host = gpu_cluster.this_host()
    shared = host.spawn_procs(per_host={"gpus": 8}, name="shared", gpus_per_proc=0.5)
    try:
        assert [e["CUDA_VISIBLE_DEVICES"] for e in _envs(shared)] == ["3", "3", "5", "5", "6", "6", "7", "7"]
    finally:
        shared.stop()
    pairs = host.spawn_procs(per_host={"gpus": 2}, name="pairs", gpus_per_proc=2)
    try:
        assert [e["CUDA_VISIBLE_DEVICES"] for e in _envs(pairs)] == ["3,5", "6,7"]
    finally:
        pairs.stop()


def test_zero_gpus_per_proc_is_refused_not_taken_as_one(gpu_cluster):
    for zero in (0, 0.0):
        with pytest.raises(ValueError, match=r"gpus_per_proc=0"):
            gpu_cluster.this_host().spawn_procs(per_host={"gpus": 2}, name="zero", gpus_per_proc=zero)


def test_binding_off_leaves_every_gpu_visible_but_still_sets_the_ranks(gpu_cluster):
    procs = gpu_cluster.this_host().spawn_procs(per_host={"gpus": 6}, name="unbound", bind_gpus=False)
    try:
        envs = _envs(procs)
        assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {"3,5,6,7"}  # the agent's, inherited
        assert [e["LOCAL_RANK"] for e in envs] == [str(r) for r in range(6)]
    finally:
        procs.stop()


def test_a_restarted_proc_gets_its_gpu_again(gpu_cluster):
    procs = gpu_cluster.this_host().spawn_procs(per_host={"gpus": 2}, name="restarted")
    try:
        procs.setup_torch_distributed(backend="gloo")  # (it adds variables; the binding stays)
        os.kill(procs.pids[1], 9)
        assert wait_until(lambda: procs.restart_failed() == [1], 30)
        envs = _envs(procs)
        assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["3", "5"]
        assert envs[1]["RANK"] == "1"
    finally:
        procs.stop()


def test_host_agents_of_one_machine_split_its_gpus():
    c = _start_with_gpus("3,5,6,7", hosts=2)
    try:
        procs = c.this_host().spawn_procs(per_host={"gpus": 2}, name="split")
        envs = _envs(procs)
        assert [(e["CUDA_VISIBLE_DEVICES"], e["RANK"], e["LOCAL_RANK"]) for e in envs] == [
            ("3", "0", "0"), ("5", "1", "1"), ("6", "2", "0"), ("7", "3", "1")]
        with pytest.raises(ValueError, match="split between the 2 host agents"):
            c.this_host().spawn_procs(per_host={"gpus": 3}, name="oversplit")
    finally:
        _stop(c)


# fast tests: no processes -----------------------------------------------------------------

def _inventory(*ids: str) -> list[dict]:
    return [gpu_inventory.gpu(int(i) if i.isdigit() else None, i) for i in ids]


def test_the_inventory_is_the_agents_cuda_visible_devices_else_the_machines():
    nvml = ([gpu_inventory.gpu(0, "GPU-a", "NVIDIA H200", 143771), gpu_inventory.gpu(1, "GPU-b", "NVIDIA H200", 143771)],
            "nvml")
    listed, source = gpu_inventory.discover({"CUDA_VISIBLE_DEVICES": "1,GPU-a"}, lambda: nvml)
    assert source == "CUDA_VISIBLE_DEVICES"
    assert [(g["index"], g["id"], g["name"]) for g in listed] == [(1, "1", "NVIDIA H200"), (0, "GPU-a", "NVIDIA H200")]
    assert gpu_inventory.discover({}, lambda: nvml) == nvml
    assert gpu_inventory.discover({}, lambda: None) == ([], "none")
    for hidden in ("", "-1", "NoDevFiles"):
        assert gpu_inventory.discover({"CUDA_VISIBLE_DEVICES": hidden}, lambda: nvml)[0] == []
    assert proc_gpus.visible_devices("0,2,-1,3") == ["0", "2"]  # CUDA stops at the first bad entry


def test_nvidia_smi_lines_become_gpu_records():
    text = "0, GPU-8c1b, NVIDIA H200, 143771\n1, GPU-9d2c, NVIDIA H200, 143771\n"
    assert gpu_inventory.parse_smi(text) == [gpu_inventory.gpu(0, "GPU-8c1b", "NVIDIA H200", 143771),
                                             gpu_inventory.gpu(1, "GPU-9d2c", "NVIDIA H200", 143771)]


def test_the_plan_binds_proc_i_of_each_host_to_its_ith_gpu_and_numbers_ranks_across_hosts():
    shares = gpu_binding.shares([("0", "a", _inventory("0", "1")), ("1", "b", _inventory("4", "5"))])
    envs = gpu_binding.plan({"gpus": 2}, {"hosts": 2}, ["0", "1"], shares)
    assert [(e["CUDA_VISIBLE_DEVICES"], e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"]) for e in envs] == [
        ("0", "0", "0", "0"), ("1", "1", "1", "0"), ("4", "2", "0", "1"), ("5", "3", "1", "1")]
    # the same variables setup_torch_distributed sets later: nothing changes under a live group
    for r, e in enumerate(envs):
        wanted = torch_env.rank_env(Extent({"hosts": 2, "gpus": 2}), r, "x", 1)
        assert all(wanted[k] == v for k, v in e.items() if k != "CUDA_VISIBLE_DEVICES")


def test_agents_of_one_machine_split_its_gpus_and_say_so_when_there_are_too_few():
    same = _inventory("0", "1", "2", "3")
    shares = gpu_binding.shares([("0", "box", same), ("1", "box", same)])
    assert [g["id"] for g in shares["0"].gpus] == ["0", "1"] and [g["id"] for g in shares["1"].gpus] == ["2", "3"]
    envs = gpu_binding.plan({"gpus": 2}, {"hosts": 2}, ["0", "1"], shares)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "2", "3"]
    with pytest.raises(ValueError, match="its machine box has 4, split between the 2 host agents"):
        gpu_binding.plan({"gpus": 3}, {"hosts": 2}, ["0", "1"], shares)
    crowded = gpu_binding.shares([(str(h), "box", _inventory("0")) for h in range(2)])
    with pytest.raises(ValueError, match="host 0 has 0 GPUs: its machine box has 1"):
        gpu_binding.plan({"gpus": 1}, {"hosts": 2}, ["0", "1"], crowded)


def test_hosts_without_gpus_get_ranks_only_and_meshes_without_a_gpus_dimension_get_nothing():
    shares = gpu_binding.shares([("0", "cpu", [])])
    assert gpu_binding.plan({"gpus": 3}, {}, ["0"], shares) == [
        {"RANK": str(r), "WORLD_SIZE": "3", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "3", "GROUP_RANK": "0",
         "GROUP_WORLD_SIZE": "1"} for r in range(3)]
    assert gpu_binding.plan({"procs": 3}, {}, ["0"], gpu_binding.shares([("0", "m", _inventory("0"))])) == []


def test_gpus_per_proc_takes_whole_numbers_and_unit_fractions_only():
    assert gpu_binding.parse_gpus_per_proc(1) == (1, 1)
    assert gpu_binding.parse_gpus_per_proc(2) == (2, 1)
    assert gpu_binding.parse_gpus_per_proc(0.25) == (1, 4)
    for bad in (0, -1, 1.5, 0.4, True, "1"):
        with pytest.raises(ValueError, match="gpus_per_proc"):
            gpu_binding.parse_gpus_per_proc(bad)


def test_a_bound_rank_uses_device_0_and_an_unbound_one_its_local_rank():
    assert proc_gpus.device_for(["5"], 3, 1) == 0
    assert proc_gpus.device_for(None, 3, 8) == 3
    assert proc_gpus.device_for(["0", "1"], 3, 2) == 1


def test_health_names_a_procs_gpu_from_its_hosts_inventory():
    inventory = [gpu_inventory.gpu(5, "GPU-x", "NVIDIA H200", 143771)]
    assert gpu_binding.gpus_of(inventory, {"CUDA_VISIBLE_DEVICES": "GPU-x"}) == inventory
    assert gpu_binding.gpus_of(inventory, {"RANK": "0"}) == []


# setup_torch_distributed on GPUs: the CUDA calls faked in the procs -------------------------

class FakeCuda(Actor):
    """Stands in for CUDA in its proc: ``proc.gpus``' two CUDA calls report the GPU
    ``uuid`` at device 0 and record the devices set."""

    @endpoint
    def install(self, uuid: str) -> None:
        from monarch_nb.proc import gpus

        set_devices: list[int] = []
        gpus.cuda_report = lambda local_rank: {"device": 0, "uuid": uuid, "name": "Fake GPU",
                                               "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
        gpus.set_device = set_devices.append
        gpus.set_devices = set_devices

    @endpoint
    def devices_set(self) -> list[int]:
        from monarch_nb.proc import gpus

        return gpus.set_devices


def test_setup_on_gpus_sets_each_ranks_device_and_refuses_ranks_sharing_one(gpu_cluster):
    procs = gpu_cluster.this_host().spawn_procs(per_host={"gpus": 2}, name="nccl", gpus_per_proc=0.5)
    try:
        fake = procs.spawn("fake", FakeCuda)
        fake.install.call("GPU-same").get()  # gpus_per_proc=0.5: both ranks on GPU 3
        with pytest.raises(ValueError, match=r"ranks 0, 1 would share one GPU \(Fake GPU GPU-same, "
                                             r"CUDA_VISIBLE_DEVICES=3\).*Duplicate GPU"):
            procs.setup_torch_distributed()
        assert {e["CUDA_VISIBLE_DEVICES"] for e in _envs(procs)} == {"3"}
        assert fake.devices_set.call().get().values() == [[], []]  # nothing set before the error
        with pytest.raises(ValueError, match="would share one GPU"):
            procs.setup_torch_distributed(backend="nccl")
        for rank in (0, 1):
            fake.slice(gpus=rank).install.call_one(f"GPU-{rank}").get()
        envs = procs.setup_torch_distributed().values()
        assert [e["RANK"] for e in envs] == ["0", "1"]
        assert fake.devices_set.call().get().values() == [[0], [0]]
    finally:
        procs.stop()


def test_gloo_setup_is_not_refused_for_ranks_sharing_a_gpu(gpu_cluster):
    procs = gpu_cluster.this_host().spawn_procs(per_host={"gpus": 2}, name="gloo", gpus_per_proc=0.5)
    try:
        procs.spawn("fake", FakeCuda).install.call("GPU-same").get()
        assert [e["RANK"] for e in procs.setup_torch_distributed(backend="gloo").values()] == ["0", "1"]
    finally:
        procs.stop()


def test_the_shared_gpu_message_names_every_rank_on_the_gpu():
    report = {"device": 0, "uuid": "GPU-a", "name": "NVIDIA H200", "visible": None}
    assert torch_env.shared_gpus([report, {**report, "uuid": "GPU-b"}]) is None
    assert torch_env.shared_gpus([None, None]) is None
    text = torch_env.shared_gpus([report, {**report, "uuid": "GPU-b"}, report])
    assert text is not None and text.startswith("ranks 0, 2 would share one GPU (NVIDIA H200 GPU-a")


def test_a_second_mesh_takes_the_gpus_the_first_leaves_free(gpu_cluster):
    host = gpu_cluster.this_host()
    first = host.spawn_procs(per_host={"gpus": 2}, name="first")
    try:
        again = host.spawn_procs(per_host={"gpus": 2}, name="first")  # re-running the cell: the same mesh
        assert again.pids == first.pids
        second = host.spawn_procs(per_host={"gpus": 2}, name="second")
        try:
            assert [e["CUDA_VISIBLE_DEVICES"] for e in _envs(second)] == ["6", "7"]
            with pytest.raises(ValueError, match=r"4 GPUs \(3, 5, 6, 7\), 4 of them bound to the live procs of "
                                                 r"'first' \(3, 5\), 'second' \(6, 7\); stop those procs"):
                host.spawn_procs(per_host={"gpus": 1}, name="third")
        finally:
            second.stop()
        replaced = host.spawn_procs(per_host={"gpus": 2}, name="first", replace=True)
        assert [e["CUDA_VISIBLE_DEVICES"] for e in _envs(replaced)] == ["3", "5"]
    finally:
        first.stop()


def test_spmd_sets_each_ranks_device_and_its_env_setup_refuses_a_shared_gpu(gpu_cluster):
    procs = gpu_cluster.this_host().spawn_procs(per_host={"gpus": 2}, name="spmd", gpus_per_proc=0.5)
    try:
        fake = procs.spawn("fake", FakeCuda)
        fake.install.call("GPU-same").get()
        with pytest.raises(ValueError, match="ranks 0, 1 would share one GPU"):
            setup_torch_elastic_env(procs)
        procs.spawn("spmd", SPMDActor).setup_env.call("127.0.0.1", 29500).get()
        assert fake.devices_set.call().get().values() == [[0], [0]]
    finally:
        procs.stop()
