"""ReplicaGroups: a failed group is torn down and respawned while the healthy ones keep
stepping in the same procs, and rejoins with a healthy group's state."""

from __future__ import annotations

import os
import signal
import time

import pytest

from monarch_nb import Cluster
from monarch_nb.actor import Actor, endpoint
from monarch_nb.errors import ClusterError
from monarch_nb.ft import GroupState, ReplicaGroups, inject_fault
from monarch_nb.ft.placement import hosts_of
from conftest import cluster_processes, pids_alive, wait_until

BOUND_S = 60


class Counter(Actor):
    """A stand-in trainer: its state is the number of steps it made."""

    def __init__(self):
        self.steps = 0

    @endpoint
    def step(self) -> int:
        self.steps += 1
        return self.steps

    @endpoint
    def state(self) -> int:
        return self.steps

    @endpoint
    def load(self, steps: int) -> None:
        self.steps = steps

    @endpoint
    def nap(self, seconds: float) -> None:
        time.sleep(seconds)


def _copy_state(group, donor):
    if donor is not None:
        group.actors.load.call(donor.actors.slice(gpus=0).state.call_one().get(timeout=BOUND_S)).get(timeout=BOUND_S)


@pytest.fixture
def groups(cluster):
    made = []

    def make(**options):
        options.setdefault("on_join", _copy_state)
        made.append(ReplicaGroups(cluster.host_mesh(), "ctr", Counter, num_groups=3, per_group={"gpus": 2},
                                  **options))
        return made[-1]

    yield make
    for g in made:
        g.stop()


def test_a_killed_rank_costs_its_group_only_and_the_group_rejoins_with_a_healthy_ones_state(groups):
    rg = groups()
    for _ in range(3):
        assert sorted(rg.call("step")) == [0, 1, 2]
    healthy_pids = [rg.groups[0].procs.pids, rg.groups[2].procs.pids]
    lost = rg.groups[1].procs.pids
    inject_fault(rg.groups[1].procs, "kill", ranks=[1])
    assert wait_until(lambda: pids_alive([lost[1]]) == [], BOUND_S)
    steps = rg.call("step")
    assert sorted(steps) == [0, 2]  # the step ran on the others
    assert rg.groups[1].state in (GroupState.RECOVERING, GroupState.JOINING)
    while rg.groups[1].state is not GroupState.HEALTHY:  # the healthy groups keep stepping meanwhile
        assert {0, 2} <= set(rg.call("step"))
    assert rg.wait_healthy(BOUND_S)
    assert [rg.groups[0].procs.pids, rg.groups[2].procs.pids] == healthy_pids  # untouched
    assert not set(rg.groups[1].procs.pids) & set(lost)  # a new group
    assert pids_alive(lost) == []  # its surviving rank was torn down with it
    after = rg.call("step")
    assert sorted(after) == [0, 1, 2]  # it rejoined at a step's start
    assert after[1].values() == after[0].values()  # it rejoined with a healthy group's state
    status = rg.status()[1]
    assert status["restarts"] == 1 and "SupervisionError" in status["last_failure"]
    assert len(status["recoveries_s"]) == 1


def test_failures_the_groups_recover_reach_no_unhandled_failure_hook(groups):
    from monarch_nb.actor import set_failure_hook

    heard = []
    set_failure_hook(lambda cluster_id, failure, owner: heard.append(failure))
    try:
        rg = groups(spare=True)
        assert wait_until(lambda: rg.spare.ready_pids() is not None, BOUND_S)
        inject_fault(rg.groups[1].procs, "kill", ranks=[0])
        assert wait_until(lambda: 1 not in rg.call("step"), BOUND_S)
        assert rg.wait_healthy(BOUND_S), rg.status()
        assert wait_until(lambda: rg.spare.ready_pids() is not None, BOUND_S)  # a new spare, after the fault
        spare = rg.spare.take()
        inject_fault(spare, "kill")  # a spare's death too
        rg.call("step")
        spare.stop()
        # What the groups did not recover would have reached the hook by now: a call
        # after the fault has heard of it (actors_gone comes before the reply).
        assert heard == []
    finally:
        set_failure_hook(None)


def test_a_hung_rank_past_the_step_timeout_is_recovered(groups):
    rg = groups(step_timeout=5.0)
    rg.call("step")
    hung = rg.groups[0].procs.pids[0]
    inject_fault(rg.groups[0].procs, "hang", ranks=[0])
    assert wait_until(lambda: sorted(rg.call("step")) == [1, 2], BOUND_S)
    assert "TimeoutError" in rg.status()[0]["last_failure"]
    assert rg.wait_healthy(BOUND_S)
    assert pids_alive([hung]) == []  # stopping its group killed the hung process
    assert sorted(rg.call("step")) == [0, 1, 2]


def test_a_group_past_max_restarts_stays_out_and_none_left_is_a_clear_error(groups):
    rg = groups(max_restarts=0)
    for index in range(3):
        inject_fault(rg.groups[index].procs, "kill", ranks=[0])
        assert wait_until(lambda: index not in rg.call("step") if rg.healthy() else True, BOUND_S)
        assert rg.groups[index].state is GroupState.FAILED
    with pytest.raises(ClusterError, match="no healthy replica group"):
        rg.call("step")
    assert all(s["state"] == "failed" for s in rg.status())


def test_bad_options_are_refused_before_anything_starts(cluster):
    with pytest.raises(ValueError, match="num_groups=0"):
        ReplicaGroups(cluster.host_mesh(), "x", Counter, num_groups=0, per_group={"gpus": 1})
    with pytest.raises(ValueError, match="max_restarts=-1"):
        ReplicaGroups(cluster.host_mesh(), "x", Counter, num_groups=1, per_group={"gpus": 1}, max_restarts=-1)
    with pytest.raises(ValueError, match="hosts_per_group=1 needs 2 hosts, one set per group; the host mesh has 1"):
        ReplicaGroups(cluster.host_mesh(), "x", Counter, num_groups=2, per_group={"gpus": 1}, hosts_per_group=1)
    from monarch_nb.allocators.local import LocalHosts

    with pytest.raises(ValueError, match="not both"):
        ReplicaGroups(cluster.host_mesh(), "x", Counter, num_groups=1, per_group={"gpus": 1}, hosts_per_group=1,
                      allocator=LocalHosts(1))
    with pytest.raises(ValueError, match="reallocate_after=2: .*with hosts_per_group or allocator"):
        ReplicaGroups(cluster.host_mesh(), "x", Counter, num_groups=1, per_group={"gpus": 1}, reallocate_after=2)
    with pytest.raises(ValueError, match="reallocate_after=0"):
        ReplicaGroups(cluster.host_mesh(), "x", Counter, num_groups=1, per_group={"gpus": 1}, reallocate_after=0,
                      allocator=LocalHosts(1))
    unrelated = cluster.host_mesh().spawn_procs(per_host={"gpus": 1}, name="twice_data")  # not a group's name
    first = ReplicaGroups(cluster.host_mesh(), "twice", Counter, num_groups=1, per_group={"gpus": 1})
    unrelated.stop()
    try:
        with pytest.raises(ValueError, match="'twice': proc meshes of that name run already .*groups.stop"):
            ReplicaGroups(cluster.host_mesh(), "twice", Counter, num_groups=1, per_group={"gpus": 1})
        assert first.call("step")[0].values() == [1]  # the running groups untouched
    finally:
        first.stop()
    with pytest.raises(TypeError, match="give an allocator such as"):
        ReplicaGroups(cluster.host_mesh(), "x", Counter, num_groups=1, per_group={"gpus": 1}, allocator="slurm")
    assert cluster.allocations == {}
    assert cluster.info()["proc_meshes"] == {} or all(
        not n.startswith("x_") for n in cluster.info()["proc_meshes"])


class GlooRank(Actor):
    def __init__(self):
        import torch.distributed as dist
        dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_* set by the group's setup

    @endpoint
    def all_reduce(self) -> int:
        import torch
        import torch.distributed as dist
        t = torch.tensor([dist.get_rank() + 1])
        dist.all_reduce(t)
        return int(t.item())


def test_a_recovered_group_has_a_fresh_torch_distributed_group(cluster):
    pytest.importorskip("torch", reason="torch is not installed")
    rg = ReplicaGroups(cluster.host_mesh(), "gloo", GlooRank, num_groups=2, per_group={"gpus": 2},
                       backend="gloo")
    try:
        assert {g: v.values() for g, v in rg.call("all_reduce").items()} == {0: [3, 3], 1: [3, 3]}
        inject_fault(rg.groups[1].procs, "kill", ranks=[0])
        assert wait_until(lambda: 1 not in rg.call("all_reduce"), BOUND_S)
        assert rg.wait_healthy(BOUND_S)
        assert {g: v.values() for g, v in rg.call("all_reduce").items()} == {0: [3, 3], 1: [3, 3]}
    finally:
        rg.stop()


def test_group_loops_replace_a_killed_group_on_its_own_thread_while_the_others_step_on(groups):
    rg = groups()
    loops = rg.run("step")
    assert loops.wait(lambda: min(loops.steps.values()) >= 3, BOUND_S)
    with pytest.raises(ClusterError, match=r"stop them first: loops.stop\(\)"):
        rg.call("step")  # the loops own the groups' steps
    healthy_pids = [rg.groups[0].procs.pids, rg.groups[2].procs.pids]
    inject_fault(rg.groups[1].procs, "kill", ranks=[0])
    assert loops.wait(lambda: rg.groups[1].restarts == 1 and rg.groups[1].state is GroupState.HEALTHY, BOUND_S)
    replaced_at = dict(loops.steps)
    assert loops.wait(lambda: all(loops.steps[i] > replaced_at[i] + 2 for i in range(3)), BOUND_S)  # all step on
    assert [rg.groups[0].procs.pids, rg.groups[2].procs.pids] == healthy_pids
    assert set(rg.status()[1]["recovery_phases_s"]) >= {"teardown", "procs", "actors", "join"}
    assert loops.stop(timeout=BOUND_S) and loops.running() == []
    assert loops.failed == {0: 0, 1: 1, 2: 0}  # the killed group's step in flight, nothing of the others
    # stopped at a step's end: the replaced group resumed from a healthy group's count (on_join)
    counts = {i: vm.values()[0] for i, vm in rg.call("state").items()}
    assert counts[1] >= loops.steps[1]


def test_steps_that_stopping_the_groups_ends_are_not_counted_as_failed(groups):
    rg = groups()
    loops = rg.run("step")
    assert loops.wait(lambda: min(loops.steps.values()) >= 3, BOUND_S)
    rg.stop()  # each loop's step in flight ends with its procs
    assert loops.running() == [] and loops.failed == {0: 0, 1: 0, 2: 0}


def test_a_warm_spare_replaces_a_failed_group_and_a_new_spare_is_started(groups):
    rg = groups(spare=True)
    assert wait_until(lambda: rg.spare.ready_pids() is not None, BOUND_S)  # the spare's procs are up
    spare_pids = rg.spare.ready_pids()
    lost = rg.groups[1].procs.pids
    inject_fault(rg.groups[1].procs, "kill", ranks=[0])
    assert wait_until(lambda: 1 not in rg.call("step"), BOUND_S)
    assert rg.wait_healthy(BOUND_S)
    assert rg.groups[1].procs.pids == spare_pids  # replaced on the spare's procs
    assert pids_alive(lost) == []
    after = rg.call("step")
    assert sorted(after) == [0, 1, 2] and after[1].values() == after[0].values()
    assert wait_until(lambda: rg.spare.ready_pids() is not None, BOUND_S)  # a new spare, once the group is back
    assert not set(rg.spare.ready_pids()) & set(spare_pids)


@pytest.fixture
def hosts4():
    c = Cluster.start_ephemeral(hosts=4)
    yield c
    c.stop()
    assert wait_until(lambda: not cluster_processes(c.path), 15), cluster_processes(c.path)


def test_a_group_on_a_host_of_its_own_survives_that_host_lost_on_a_free_host(hosts4):
    rg = ReplicaGroups(hosts4.host_mesh(), "ctr", Counter, num_groups=2, per_group={"gpus": 2},
                       on_join=_copy_state, hosts_per_group=1)
    try:
        assert [hosts_of(g.procs) for g in rg.groups] == [["host0"], ["host1"]]
        loops = rg.run("step")
        assert loops.wait(lambda: min(loops.steps.values()) >= 3, BOUND_S)
        healthy = rg.groups[0].procs.pids
        inject_fault(rg.groups[1].procs, "host", ranks=[0])  # host1's agent, and with it the group's procs
        assert loops.wait(lambda: rg.groups[1].restarts == 1 and rg.groups[1].is_healthy, BOUND_S), rg.status()
        at = dict(loops.steps)
        assert loops.wait(lambda: all(loops.steps[i] > at[i] + 2 for i in range(2)), BOUND_S)
        assert hosts_of(rg.groups[1].procs) == ["host2"]  # the first free live host
        assert rg.groups[0].procs.pids == healthy and loops.failed == {0: 0, 1: 1}
    finally:
        rg.stop()


def test_a_warm_spare_on_a_free_host_replaces_a_group_whose_host_is_lost(hosts4):
    rg = ReplicaGroups(hosts4.host_mesh(), "ctr", Counter, num_groups=2, per_group={"gpus": 2},
                       on_join=_copy_state, hosts_per_group=1, spare=True)
    try:
        assert wait_until(lambda: rg.spare.ready_pids() is not None, BOUND_S)
        assert rg.spare.host_ids() == ["host2"]
        spare_pids = rg.spare.ready_pids()
        loops = rg.run("step")
        assert loops.wait(lambda: min(loops.steps.values()) >= 3, BOUND_S)
        inject_fault(rg.groups[1].procs, "host", ranks=[0])
        assert loops.wait(lambda: rg.groups[1].restarts == 1 and rg.groups[1].is_healthy, BOUND_S), rg.status()
        assert rg.groups[1].procs.pids == spare_pids and hosts_of(rg.groups[1].procs) == ["host2"]
        assert wait_until(lambda: rg.spare.ready_pids() is not None, BOUND_S)
        assert rg.spare.host_ids() == ["host3"]  # host1 is lost: the new spare takes the one host left
    finally:
        rg.stop()


def _fail_group_and_wait_for_its_replacement(rg, index):
    """Kill a rank of group ``index``, see its step fail, and wait until its replacement
    is spawned but has not rejoined (``JOINING``: it joins at the next call's start)."""
    lost = rg.groups[index].procs.pids
    inject_fault(rg.groups[index].procs, "kill", ranks=[0])
    assert wait_until(lambda: index not in rg.call("step"), BOUND_S)
    assert wait_until(lambda: rg.groups[index].state is GroupState.JOINING, BOUND_S), rg.status()
    return lost


def test_a_replacement_killed_before_it_rejoins_is_respawned_again_counting_toward_max_restarts(groups):
    rg = groups(max_restarts=3)
    rg.call("step")
    healthy_pids = [rg.groups[0].procs.pids, rg.groups[2].procs.pids]
    lost = _fail_group_and_wait_for_its_replacement(rg, 1)
    replacement = rg.groups[1].procs.pids
    inject_fault(rg.groups[1].procs, "kill", ranks=[1])  # the new group dies before it rejoins
    assert wait_until(lambda: pids_alive([replacement[1]]) == [], BOUND_S)
    assert sorted(rg.call("step")) == [0, 2]  # its on_join failed: respawned again; the others stepped
    assert rg.status()[1]["last_failure"].startswith("on_join failed: SupervisionError")

    def healthy_ones_step_until_it_is_back():
        assert {0, 2} <= set(rg.call("step"))
        return rg.groups[1].is_healthy

    assert wait_until(healthy_ones_step_until_it_is_back, BOUND_S), rg.status()
    after = rg.call("step")
    assert sorted(after) == [0, 1, 2] and after[1].values() == after[0].values()
    assert rg.groups[1].restarts == 2  # both respawns count toward max_restarts
    assert [rg.groups[0].procs.pids, rg.groups[2].procs.pids] == healthy_pids
    assert pids_alive(lost + replacement) == []  # no orphan of either dead group
    assert not set(rg.groups[1].procs.pids) & set(lost + replacement)


def test_a_replacement_killed_before_it_rejoins_past_max_restarts_stays_out_with_a_clear_error(groups):
    rg = groups(max_restarts=1)
    rg.call("step")
    lost = _fail_group_and_wait_for_its_replacement(rg, 1)
    replacement = rg.groups[1].procs.pids
    inject_fault(rg.groups[1].procs, "kill", ranks=[0])
    assert wait_until(lambda: pids_alive([replacement[0]]) == [], BOUND_S)
    assert sorted(rg.call("step")) == [0, 2]
    status = rg.status()[1]
    assert status["state"] == "failed" and status["restarts"] == 1, status
    assert status["last_failure"].startswith("on_join failed: SupervisionError"), status
    assert rg.wait_healthy(BOUND_S) and sorted(rg.call("step")) == [0, 2]  # the others step on
    assert pids_alive(lost + replacement) == []  # its surviving rank was stopped with it


def test_a_replacement_killed_before_it_rejoins_under_group_loops_is_respawned_by_its_loop(groups):
    killed: list[int] = []

    def kill_first_replacement(group, donor):
        if not killed:  # the first replacement dies between its spawn and its rejoining
            killed.extend(group.procs.pids)
            inject_fault(group.procs, "kill", ranks=[0])
            assert wait_until(lambda: pids_alive(killed[:1]) == [], BOUND_S)
        _copy_state(group, donor)

    rg = groups(max_restarts=3, on_join=kill_first_replacement)
    loops = rg.run("step")
    assert loops.wait(lambda: min(loops.steps.values()) >= 3, BOUND_S)
    healthy_pids = [rg.groups[0].procs.pids, rg.groups[2].procs.pids]
    inject_fault(rg.groups[1].procs, "kill", ranks=[0])
    assert loops.wait(lambda: rg.groups[1].restarts == 2 and rg.groups[1].is_healthy, BOUND_S), rg.status()
    at = dict(loops.steps)
    assert loops.wait(lambda: all(loops.steps[i] > at[i] + 2 for i in range(3)), BOUND_S)
    assert [rg.groups[0].procs.pids, rg.groups[2].procs.pids] == healthy_pids
    assert loops.stop(timeout=BOUND_S) and loops.failed == {0: 0, 1: 1, 2: 0}
    assert pids_alive(killed) == []


class StartsFlakily(Counter):
    """A Counter whose constructor raises while ``flag`` exists (the file the test
    creates), removing it first when ``once``: a respawn that fails for a passing cause."""

    def __init__(self, flag: str, once: bool):
        if os.path.exists(flag):
            if once:
                os.remove(flag)
            raise RuntimeError("the rendezvous failed")
        super().__init__()


@pytest.fixture
def flaky_groups(cluster, tmp_path):
    """``make(once, **options)``: 2 groups × 1 proc of :class:`StartsFlakily`, and the flag
    that makes their next constructors fail (created by the test)."""
    made = []
    flag = tmp_path / "fail-next-start"

    def make(once: bool, **options):
        made.append(ReplicaGroups(cluster.host_mesh(), "flaky", StartsFlakily, str(flag), once, num_groups=2,
                                  per_group={"gpus": 1}, on_join=_copy_state, **options))
        return made[-1], flag

    yield make
    for g in made:
        g.stop()


def _kill_group(rg, index):
    lost = rg.groups[index].procs.pids
    inject_fault(rg.groups[index].procs, "kill", ranks=[0])
    assert wait_until(lambda: pids_alive(lost) == [], BOUND_S)
    return lost


def test_a_replacement_whose_start_fails_once_is_respawned_again_counting_toward_max_restarts(flaky_groups):
    rg, flag = flaky_groups(once=True, max_restarts=5)
    rg.call("step")
    flag.touch()
    lost = _kill_group(rg, 1)
    assert sorted(rg.call("step")) == [0]
    assert rg.wait_healthy(BOUND_S)
    status = rg.status()[1]
    assert status["state"] == "healthy", status
    assert status["restarts"] == 2, status  # the respawn that failed and the one that rejoined
    assert status["last_failure"].startswith("recovery failed: ActorError"), status
    assert "the rendezvous failed" in status["last_failure"], status
    after = rg.call("step")
    assert sorted(after) == [0, 1] and after[1].values() == after[0].values()
    assert not set(rg.groups[1].procs.pids) & set(lost)


def test_a_replacement_that_keeps_failing_to_start_stays_out_after_max_restarts(flaky_groups):
    rg, flag = flaky_groups(once=False, max_restarts=2)
    rg.call("step")
    flag.touch()
    _kill_group(rg, 1)
    assert sorted(rg.call("step")) == [0]
    assert wait_until(lambda: rg.groups[1].state is GroupState.FAILED, BOUND_S), rg.status()
    status = rg.status()[1]
    assert status["restarts"] == 2, status  # both respawns tried, each counted
    assert status["last_failure"].startswith("recovery failed: ActorError"), status
    assert rg.wait_healthy(BOUND_S)  # a group failed for good does not count (its docstring)
    assert sorted(rg.call("step")) == [0]


def test_a_replacement_whose_start_fails_once_under_group_loops_is_respawned_by_its_loop(flaky_groups):
    rg, flag = flaky_groups(once=True, max_restarts=5)
    loops = rg.run("step")
    assert loops.wait(lambda: min(loops.steps.values()) >= 3, BOUND_S)
    flag.touch()
    _kill_group(rg, 1)
    assert loops.wait(lambda: rg.groups[1].state is GroupState.FAILED or rg.groups[1].is_healthy
                      and rg.groups[1].restarts == 2, BOUND_S), rg.status()
    assert rg.groups[1].is_healthy, rg.status()
    at = dict(loops.steps)
    assert loops.wait(lambda: all(loops.steps[i] > at[i] + 2 for i in range(2)), BOUND_S)  # its loop steps on
    assert loops.stop(timeout=BOUND_S) and loops.failed == {0: 0, 1: 1}


def test_every_group_failing_at_once_recovers_all_and_a_call_meanwhile_is_a_clear_error(groups):
    rg = groups()
    for _ in range(2):
        rg.call("step")
    lost = [pid for g in rg.groups for pid in g.procs.pids]
    for group in rg.groups:
        inject_fault(group.procs, "kill", ranks=[1])
    assert wait_until(lambda: pids_alive(lost[1::2]) == [], BOUND_S)
    assert rg.call("step") == {}  # every group's step failed: all are recovered
    assert all(s["state"] in ("recovering", "joining") for s in rg.status())
    try:
        rg.call("step")  # unless all have already rejoined: none is healthy
    except ClusterError as e:
        assert "no healthy replica group" in str(e)
    assert rg.wait_healthy(BOUND_S)
    after = rg.call("step")
    assert sorted(after) == [0, 1, 2]
    assert all(s["restarts"] == 1 and "SupervisionError" in s["last_failure"] for s in rg.status())
    assert pids_alive(lost) == []  # every dead group's surviving rank was torn down
    # no healthy donor was left: the first to rejoin starts fresh (donor None), the others copy it
    assert all(vm.values() == [1, 1] for vm in after.values())


def test_every_group_failing_at_once_under_group_loops_recovers_all(groups):
    rg = groups()
    loops = rg.run("step")
    assert loops.wait(lambda: min(loops.steps.values()) >= 2, BOUND_S)
    lost = [pid for g in rg.groups for pid in g.procs.pids]
    for group in rg.groups:
        inject_fault(group.procs, "kill", ranks=[0])
    assert loops.wait(lambda: all(g.restarts == 1 and g.is_healthy for g in rg.groups), BOUND_S), rg.status()
    at = dict(loops.steps)
    assert loops.wait(lambda: all(loops.steps[i] > at[i] + 2 for i in range(3)), BOUND_S)
    assert loops.stop(timeout=BOUND_S) and loops.failed == {0: 1, 1: 1, 2: 1}
    assert pids_alive(lost) == []


class Weights(Actor):
    """A stand-in trainer whose weights are a tensor it can expose as an RDMABuffer."""

    def __init__(self):
        import torch
        self.weights = torch.zeros(4096, dtype=torch.float32)
        self.buffer = None

    @endpoint
    def step(self) -> float:
        import torch
        self.weights.add_(torch.linspace(0.5, 1.5, self.weights.numel()))  # in place: the buffer stays valid
        return float(self.weights.sum())

    @endpoint
    def expose(self):
        import torch
        from monarch_nb.rdma import RDMABuffer
        if self.buffer is None:
            self.buffer = RDMABuffer(self.weights.view(torch.uint8))
        return self.buffer

    @endpoint
    def pull(self, buffer) -> None:
        import torch
        buffer.read_into(self.weights.view(torch.uint8)).get()

    @endpoint
    def values(self) -> list[float]:
        return self.weights.tolist()


def _pull_weights_over_rdma(group, donor):
    """on_join: the donor's rank 0 exposes its weights; every rank of the joining group
    reads them one-sided into its own tensor (no disk, no endpoint argument of the weights)."""
    if donor is not None:
        buffer = donor.actors.slice(gpus=0).expose.call_one().get(timeout=BOUND_S)
        group.actors.pull.call(buffer).get(timeout=BOUND_S)


def test_on_join_loads_a_healthy_groups_weights_over_rdma(cluster):
    pytest.importorskip("torch", reason="torch is not installed")
    rg = ReplicaGroups(cluster.host_mesh(), "rdma", Weights, num_groups=2, per_group={"gpus": 2},
                       on_join=_pull_weights_over_rdma)
    try:
        for _ in range(3):
            rg.call("step")
        lost = rg.groups[1].procs.pids
        inject_fault(rg.groups[1].procs, "kill", ranks=[0])
        assert wait_until(lambda: 1 not in rg.call("step"), BOUND_S)
        assert rg.wait_healthy(BOUND_S)  # rejoined: on_join pulled group 0's weights
        donor = rg.groups[0].actors.slice(gpus=0).values.call_one().get(timeout=BOUND_S)
        joined = rg.groups[1].actors.values.call().get(timeout=BOUND_S).values()
        assert joined == [donor, donor] and donor[0] > 0  # the donor's 4 steps, not a fresh group's zeros
        after = rg.call("step")
        assert after[1].values() == after[0].values()  # and they step on alike
        assert pids_alive(lost) == []
    finally:
        rg.stop()


def test_groups_on_allocations_of_their_own_get_a_new_one_when_a_host_is_lost(cluster):
    from monarch_nb.allocators.local import LocalHosts

    rg = ReplicaGroups(cluster.host_mesh(), "alloc", Counter, num_groups=2, per_group={"gpus": 2},
                       on_join=_copy_state, allocator=LocalHosts(1))
    try:
        first = [hosts_of(g.procs) for g in rg.groups]
        assert first == [["alloc_0_0-host0"], ["alloc_1_1-host0"]]
        assert sorted(cluster.allocations) == ["alloc_0_0", "alloc_1_1"]
        rg.call("step")
        healthy = rg.groups[0].procs.pids
        inject_fault(rg.groups[1].procs, "kill", ranks=[0])  # a process fault: the same hosts again
        assert wait_until(lambda: 1 not in rg.call("step"), BOUND_S)
        assert rg.wait_healthy(BOUND_S) and hosts_of(rg.groups[1].procs) == first[1], rg.status()
        inject_fault(rg.groups[1].procs, "host", ranks=[0])  # its machine: a new allocation
        assert wait_until(lambda: 1 not in rg.call("step"), BOUND_S)
        assert rg.wait_healthy(BOUND_S), rg.status()
        assert hosts_of(rg.groups[1].procs) == ["alloc_1_2-host0"]
        assert sorted(cluster.allocations) == ["alloc_0_0", "alloc_1_2"]  # the lost one was given back
        steps = rg.call("step")
        assert steps[1].values() == steps[0].values()  # rejoined with the healthy group's state
        assert rg.groups[0].procs.pids == healthy and rg.groups[1].restarts == 2
    finally:
        rg.stop()
    assert cluster.allocations == {}


def test_a_warm_spare_on_an_allocation_of_its_own_takes_over_a_group_whose_host_is_lost(cluster):
    from monarch_nb.allocators.local import LocalHosts

    rg = ReplicaGroups(cluster.host_mesh(), "spa", Counter, num_groups=2, per_group={"gpus": 1},
                       on_join=_copy_state, allocator=LocalHosts(1), spare=True)
    try:
        assert wait_until(lambda: rg.spare.ready_pids() is not None, BOUND_S)
        spare_pids, spare_hosts = rg.spare.ready_pids(), rg.spare.host_ids()
        assert spare_hosts == ["spa_spare_2-host0"]
        rg.call("step")
        inject_fault(rg.groups[1].procs, "host", ranks=[0])
        assert wait_until(lambda: 1 not in rg.call("step"), BOUND_S)
        assert rg.wait_healthy(BOUND_S), rg.status()
        assert rg.groups[1].procs.pids == spare_pids and hosts_of(rg.groups[1].procs) == spare_hosts
        assert wait_until(lambda: rg.spare.ready_pids() is not None, BOUND_S)  # a new spare, a new allocation
        assert sorted(cluster.allocations) == ["spa_0_0", "spa_spare_2", "spa_spare_3"]  # group 1's lost one given back
    finally:
        rg.stop()
    assert cluster.allocations == {}


def test_a_group_that_fails_k_times_on_its_allocation_moves_to_a_new_one(cluster):
    from monarch_nb.allocators.local import LocalHosts

    rg = ReplicaGroups(cluster.host_mesh(), "flaky", Counter, num_groups=2, per_group={"gpus": 1},
                       on_join=_copy_state, allocator=LocalHosts(1), reallocate_after=2)
    try:
        rg.call("step")
        for kills, allocation in ((1, "flaky_1_1"), (2, "flaky_1_2"), (3, "flaky_1_2")):
            inject_fault(rg.groups[1].procs, "kill", ranks=[0])  # a process fault each time, its host live
            assert wait_until(lambda: 1 not in rg.call("step"), BOUND_S)
            assert rg.wait_healthy(BOUND_S), rg.status()
            assert hosts_of(rg.groups[1].procs) == [f"{allocation}-host0"], (kills, rg.status())
        assert sorted(cluster.allocations) == ["flaky_0_0", "flaky_1_2"]
        assert rg.status()[1]["strikes"] == 1 and rg.groups[0].restarts == 0
    finally:
        rg.stop()


def test_a_group_that_fails_k_times_on_its_host_moves_to_a_free_one(hosts4):
    rg = ReplicaGroups(hosts4.host_mesh(), "ctr", Counter, num_groups=2, per_group={"gpus": 1},
                       on_join=_copy_state, hosts_per_group=1, reallocate_after=1)
    try:
        rg.call("step")
        inject_fault(rg.groups[0].procs, "kill", ranks=[0])
        assert wait_until(lambda: 0 not in rg.call("step"), BOUND_S)
        assert rg.wait_healthy(BOUND_S), rg.status()
        assert hosts_of(rg.groups[0].procs) == ["host2"]  # not host0 again, nor group 1's host1
    finally:
        rg.stop()


def test_a_donor_that_dies_during_on_join_costs_the_joining_group_nothing(groups):
    # The joining group was charged a failed respawn (restarts + 1, one step nearer
    # max_restarts, respawned again from scratch) for its donor's death.
    donors: list[int] = []

    def on_join_whose_first_donor_dies(group, donor):
        donors.append(donor.index)
        if len(donors) == 1:
            os.kill(donor.procs.pids[0], signal.SIGKILL)
            assert wait_until(lambda: donor.actors._gone_ranks(), BOUND_S)  # (the client heard of it)
        _copy_state(group, donor)

    rg = groups(max_restarts=3, on_join=on_join_whose_first_donor_dies)
    rg.call("step")
    lost = _fail_group_and_wait_for_its_replacement(rg, 1)
    replacement_of_1 = rg.groups[1].procs.pids
    stepped = rg.call("step")  # admits group 1: its first donor dies, its second serves
    assert len(donors) == 2 and donors[0] != donors[1] and 1 not in donors[:2]
    assert 1 in stepped and rg.groups[1].restarts == 1 and rg.groups[1].procs.pids == replacement_of_1
    assert rg.wait_healthy(BOUND_S)  # the dead donor is found by its own step and recovered
    assert wait_until(lambda: sorted(rg.call("step")) == [0, 1, 2], BOUND_S), rg.status()
    assert pids_alive(lost) == []


def test_an_on_join_that_hangs_past_the_step_timeout_is_a_failed_replacement_not_a_stall(groups):
    # It ran unbounded on the caller's thread: a weight copy stuck on the joining group (a
    # rank waiting in a collective) stalled every group's training for good.
    joins: list[int] = []

    def on_join_hanging_once(group, donor):
        joins.append(group.index)
        if len(joins) == 1:
            group.actors.slice(gpus=0).nap.call_one(600).get()
        _copy_state(group, donor)

    rg = groups(max_restarts=3, on_join=on_join_hanging_once, step_timeout=5.0)
    rg.call("step")
    lost = _fail_group_and_wait_for_its_replacement(rg, 1)
    hung = rg.groups[1].procs.pids
    started = time.monotonic()
    assert sorted(rg.call("step")) == [0, 2]  # bounded by step_timeout; the others stepped
    assert time.monotonic() - started < 5.0 + BOUND_S / 2
    assert rg.status()[1]["last_failure"] == "on_join failed: TimeoutError: on_join of group 1 did not finish " \
                                            "within step_timeout=5.0 s"
    assert rg.wait_healthy(BOUND_S) and sorted(rg.call("step")) == [0, 1, 2]
    assert rg.groups[1].restarts == 2 and pids_alive(lost + hung) == []


def test_a_host_a_recovered_hub_no_longer_knows_counts_as_lost_for_placement():
    # A recovered hub drops the hosts that did not answer it; placement took them for live
    # and free, and every group's next recovery chose the dead host and failed there ("can't
    # start procs on lost host(s) (host1: unknown)"), each failure costing a restart.
    from types import SimpleNamespace

    from monarch_nb.ft.placement import lost_hosts

    info = {"hosts": [{"host_id": "host0", "lost": False}, {"host_id": "host2", "lost": True}],
            "allocations": {"more": {"hosts": [{"host_id": "more0", "lost": False}]}}}
    hub = SimpleNamespace(request=lambda op, timeout: info)
    hosts = SimpleNamespace(_hosts=["host0", "host1", "host2", "host3"], _hub=lambda: hub)
    assert lost_hosts(hosts) == {"host1", "host2", "host3"}
