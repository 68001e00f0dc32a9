"""torch.distributed over proc meshes: ``setup_torch_distributed`` sets torchrun's
variables in every proc from the mesh, gloo collectives then work across the procs
(also across host agents), and re-running it is safe."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import sys
from datetime import timedelta

import pytest

from monarch_nb.actor import Actor, ClusterError, SupervisionError, endpoint
from monarch_nb.client.cluster import Cluster
from monarch_nb.proc.torch_env import ENV_KEYS, free_port
from monarch_nb.spmd import setup_torch_elastic_env

from conftest import cluster_processes, wait_until

# Not importorskip: procs import this module for its actor classes, and one test
# checks that nothing but user code loads torch there.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs the torch extra")


class EnvReader(Actor):
    """Touches no torch: shows what a proc's environment holds."""

    @endpoint
    def read(self) -> tuple[dict, bool]:
        return {k: os.environ.get(k) for k in ENV_KEYS}, "torch" in sys.modules


class Collective(Actor):
    """Joins the default process group the way a torchrun script does (env://)."""

    def __init__(self):
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if not dist.is_initialized():  # a proc has one default group; a replaced actor reuses it
            dist.init_process_group("gloo", timeout=timedelta(seconds=60))

    @endpoint
    def all_reduce(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return t.item()

    @endpoint
    def group(self) -> tuple[int, int]:
        import torch.distributed as dist

        return dist.get_rank(), dist.get_world_size()

    @endpoint
    def destroy(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()


def _spawn_procs(host, name: str, gpus: int):
    return host.spawn_procs(per_host={"gpus": gpus}, name=name)


def test_gloo_all_reduce_across_4_procs_returns_the_sum(host):
    procs = _spawn_procs(host, "ddp4", 4)
    try:
        envs = procs.setup_torch_distributed(backend="gloo").values()
        assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
        assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2", "3"]
        assert {e["WORLD_SIZE"] for e in envs} == {e["LOCAL_WORLD_SIZE"] for e in envs} == {"4"}
        assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("127.0.0.1", envs[0]["MASTER_PORT"])}
        mesh = procs.spawn("collective", Collective)
        assert mesh.group.call().get().values() == [(r, 4) for r in range(4)]
        # Rank r contributes r + 1 (the calls run at once): each ends with 1 + 2 + 3 + 4.
        futures = [mesh.slice(gpus=r).all_reduce.call_one(float(r + 1)) for r in range(4)]
        assert [f.get(timeout=60) for f in futures] == [10.0] * 4
    finally:
        procs.stop()


def test_setup_is_refused_for_a_bad_backend_address_or_port(host):
    procs = _spawn_procs(host, "ddp_bad", 1)
    try:
        with pytest.raises(ValueError, match="'gloo' or 'nccl'"):
            procs.setup_torch_distributed(backend="mpi")
        for port in (0, 70000, "29500", True):
            with pytest.raises(ValueError, match="master_port"):
                procs.setup_torch_distributed(master_port=port)
        with pytest.raises(ValueError, match="master_addr"):
            procs.setup_torch_distributed(master_addr="")
        env, _ = procs.spawn("env", EnvReader).read.call_one().get()
        assert env["MASTER_ADDR"] is None  # nothing was set (RANK was, by spawn_procs)
    finally:
        procs.stop()


def test_rerunning_setup_keeps_a_live_group_and_refuses_one_that_does_not_match(host):
    procs = _spawn_procs(host, "ddp_rerun", 2)
    try:
        first = procs.setup_torch_distributed().values()
        mesh = procs.spawn("collective", Collective)
        assert procs.setup_torch_distributed().values() == first  # the group's own variables
        assert mesh.all_reduce.call(1.0).get().values() == [2.0, 2.0]
        with pytest.raises(ClusterError, match="destroy_process_group"):
            procs.setup_torch_distributed(backend="nccl")
        with pytest.raises(ClusterError, match="backend gloo, world size 2"):
            procs.slice(gpus=0).setup_torch_distributed()
        taken = int(first[0]["MASTER_PORT"])
        with pytest.raises(ClusterError, match=f"master 127.0.0.1:{taken - 1}"):
            procs.setup_torch_distributed(master_port=taken - 1)

        # After the group is destroyed, setting up again makes a fresh, working one.
        mesh.destroy.call().get()
        procs.setup_torch_distributed()
        mesh = procs.spawn("collective", Collective, replace=True)
        assert mesh.all_reduce.call(2.0).get().values() == [4.0, 4.0]
    finally:
        procs.stop()


def test_setup_on_a_mesh_with_a_dead_proc_fails_with_supervision_error(host):
    procs = _spawn_procs(host, "ddp_dead", 2)
    try:
        os.kill(procs.pids[1], signal.SIGKILL)
        with pytest.raises(SupervisionError, match=f"rank 1 .*pid {procs.pids[1]}.* killed by SIGKILL"):
            procs.setup_torch_distributed()
        env = procs.slice(gpus=0).setup_torch_distributed().item()  # the live rank alone still works
        assert (env["RANK"], env["WORLD_SIZE"]) == ("0", "1")
    finally:
        procs.stop()


def test_a_hosts_dimension_named_in_per_host_on_one_host_gives_the_group_ranks(host):
    # Monarch's SPMD examples lay out {"hosts": H, "gpus": G} on this_host(): torchrun's
    # node index is the hosts index even though every proc is on this one host.
    procs = host.spawn_procs(per_host={"hosts": 2, "gpus": 2}, name="fake_hosts")
    try:
        envs = procs.setup_torch_distributed().values()
        assert [(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"]) for e in envs] == [
            ("0", "0", "0"), ("1", "1", "0"), ("2", "0", "1"), ("3", "1", "1")]
        assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_WORLD_SIZE"]) for e in envs} == {("4", "2", "2")}
    finally:
        procs.stop()


def test_two_host_mesh_gets_local_ranks_per_host_and_a_group_across_hosts():
    cluster = Cluster.start_ephemeral(hosts=2)
    try:
        procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 2}, name="two_hosts")
        assert procs._procs[0]["host_id"] != procs._procs[2]["host_id"]  # ranks 2, 3 on the second host agent
        readers = procs.spawn("env", EnvReader)

        # A slice is its own world: one proc per host here.
        one_per_host = procs.slice(gpus=1).setup_torch_distributed().values()
        assert [(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"]) for e in one_per_host] == [("0", "0", "0"),
                                                                                          ("1", "0", "1")]
        assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_WORLD_SIZE"]) for e in one_per_host} == {
            ("2", "1", "2")}

        port = free_port()
        setup_torch_elastic_env(procs, master_port=port)  # Monarch's name for it
        seen = readers.read.call().get().values()
        assert not any(imported for _, imported in seen), "setting the variables imported torch in a proc"
        envs = [env for env, _ in seen]
        assert [(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"]) for e in envs] == [
            ("0", "0", "0"), ("1", "1", "0"), ("2", "0", "1"), ("3", "1", "1")]
        assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_WORLD_SIZE"]) for e in envs} == {("4", "2", "2")}
        assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("127.0.0.1", str(port))}
        # gloo and NCCL open their sockets where the procs' own addresses are (loopback here).
        assert {(e["GLOO_SOCKET_IFNAME"], e["NCCL_SOCKET_IFNAME"]) for e in procs.setup_torch_distributed(
            master_port=port).values()} == {("lo", "lo")}

        mesh = procs.spawn("collective", Collective)
        assert mesh.all_reduce.call(0.5).get().values() == [2.0] * 4
    finally:
        cluster.stop()
    assert wait_until(lambda: not cluster_processes(cluster.path), 10), cluster_processes(cluster.path)


def test_a_torch_mesh_with_a_dead_rank_is_restarted_whole_and_forms_a_new_group(host):
    procs = _spawn_procs(host, "ddp-restart", 4)
    try:
        procs.setup_torch_distributed(backend="gloo")
        workers = procs.spawn("collective-restart", Collective)  # init_process_group in __init__
        assert workers.all_reduce.call(1.0).get(timeout=60).values() == [4.0] * 4
        old = procs.pids
        os.kill(old[2], signal.SIGKILL)
        with pytest.raises(SupervisionError):
            workers.all_reduce.call(1.0).get(timeout=60)
        # The group is broken for everyone: restart every rank. The new procs start with
        # the same torch variables, so each __init__ joins a new group.
        assert workers.restart(ranks=list(range(4))) == [0, 1, 2, 3]
        assert workers.all_reduce.call(2.0).get(timeout=60).values() == [8.0] * 4
        assert not set(procs.pids) & set(old)  # this handle sees the new procs
        assert procs.setup_torch_distributed(backend="gloo").values()[2]["RANK"] == "2"  # the same group
    finally:
        procs.stop()


def test_a_picked_store_port_is_free_and_below_the_ephemeral_range_where_no_connect_can_take_it(monkeypatch):
    # A port the OS picked (bind to 0) comes from the ephemeral range, where any process's
    # connect() may be given it before the TCPStore binds it: CI saw a TorchFT group's
    # store fail with EADDRINUSE so.
    from monarch_nb.proc import torch_env as proc_torch_env

    low = proc_torch_env._ephemeral_low()
    if low is None:
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range here (not Linux)")
    ports = {proc_torch_env.free_port() for _ in range(20)}
    assert all(proc_torch_env._UNASSIGNED_FROM <= p < low for p in ports), ports
    assert len(ports) > 1  # picked at random: two groups asking at once rarely meet
    with socket.socket() as taken:  # one that is listened on is never picked
        taken.bind(("", next(iter(ports))))
        taken.listen()
        monkeypatch.setattr(proc_torch_env.random, "Random", lambda: _Fixed(taken.getsockname()[1]))
        assert proc_torch_env.free_port() != taken.getsockname()[1]


class _Fixed:
    """A random.Random whose sample offers ``first`` before the rest of the range."""

    def __init__(self, first: int):
        self.first = first

    def sample(self, population, k):
        return [self.first] + [p for p in population if p != self.first][:k - 1]
