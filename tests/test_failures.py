"""The failure matrix: what the client sees for each way an actor or proc can fail, how
fast, and what stays healthy; failures handled by an owning actor's __supervise__;
partial restarts that keep healthy ranks' state."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import time
from pathlib import Path

import pytest

from monarch_nb.actor import Actor, ActorError, MeshFailure, SupervisionError, endpoint, set_failure_hook, this_host

from conftest import pids_alive, wait_until

BOUND_S = 5.0  # generous: the benchmark reports the real figure (milliseconds)


class Worker(Actor):
    def __init__(self, tag: str = "w"):
        self.tag = tag
        self.calls = 0

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def count(self) -> tuple[str, int]:
        self.calls += 1
        return self.tag, self.calls

    @endpoint
    def fail(self) -> None:
        raise ValueError("bad batch")

    @endpoint
    def exit_now(self, code: int) -> None:
        os._exit(code)

    @endpoint
    def give_up(self) -> None:
        raise SystemExit("given up")  # a BaseException: the actor dies, its proc lives on

    @endpoint
    def segfault(self) -> None:
        ctypes.string_at(0)

    @endpoint
    def barrier(self, folder: str, size: int) -> None:
        """Wait until ``size`` ranks arrived (a stand-in for a collective)."""
        Path(folder, str(os.getpid())).touch()
        while len(os.listdir(folder)) < size:
            time.sleep(0.005)


class SurvivingWorker(Worker):
    """The notebook option: a broadcast that raises leaves the actor alive."""

    survive_broadcast_errors = True


class BadInit(Actor):
    def __init__(self):
        raise RuntimeError("no GPU here")


class InitFailsIf(Actor):
    """``__init__`` raises while the file ``flag`` exists."""

    def __init__(self, flag: str):
        if os.path.exists(flag):
            raise RuntimeError(f"{flag} is there")

    @endpoint
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture
def workers(host, request):
    procs = host.spawn_procs(per_host={"gpus": 4}, name=f"w{abs(hash(request.node.name)) % 10**6}")
    mesh = procs.spawn("workers", Worker, "t")
    yield procs, mesh, mesh.pid.call().get(timeout=30).values()
    procs.stop()


@pytest.fixture
def unhandled():
    """Failures that reached the client's failure hook (then armed as by default)."""
    from monarch_nb.client.runtime import runtime

    seen: list[tuple[MeshFailure, dict | None]] = []

    def hook(cluster_id, failure, owner):
        seen.append((failure, owner))
        runtime().supervision.arm(cluster_id, failure, owner)

    set_failure_hook(hook)
    yield seen
    set_failure_hook(None)


# the matrix ------------------------------------------------------------------------------
def test_an_endpoint_exception_with_a_reply_is_an_actor_error_and_the_actor_lives_on(workers):
    procs, mesh, pids = workers
    with pytest.raises(ActorError, match="bad batch"):
        mesh.slice(gpus=1).fail.call_one().get(timeout=30)
    assert mesh.count.call().get(timeout=30).values() == [("t", 1)] * 4
    assert mesh.pid.call().get(timeout=30).values() == pids


def test_an_exception_in_a_broadcast_kills_the_actor_as_a_supervision_fault(workers, unhandled):
    # Monarch's rule: nobody waits for a broadcast's answer, so its error is a fault.
    procs, mesh, pids = workers
    mesh.slice(gpus=2).fail.broadcast()
    assert wait_until(lambda: unhandled, BOUND_S)
    failure, owner = unhandled[0]
    assert (failure.kind, failure.meshes, failure.ranks, failure.endpoint, owner) == (
        "actor_failed", ("workers",), (2,), "fail", None)
    assert "workers rank 2: broadcast fail raised ValueError: bad batch" in failure.why
    assert "bad batch" in failure.traceback
    assert failure.report().startswith(  # Monarch's report, which its programs match
        "The actor test_failures.Worker workers{'gpus': 2/4} and all its descendants have failed:")
    for _ in range(2):  # every later call to the dead actor fails, naming the cause
        with pytest.raises(SupervisionError, match=r"(?s)The actor .*workers\{'gpus': 2/4\} and all its descendants "
                                                   r"have failed.*bad batch"):
            mesh.count.call().get(timeout=30)
    # Its proc and the other actors live on (the two calls above ran on them).
    assert mesh.slice(gpus=slice(0, 2)).count.call().get(timeout=30).values() == [("t", 3)] * 2
    assert pids_alive(pids) == pids


def test_an_actor_that_survives_broadcast_errors_lives_on_and_the_next_call_raises_it(workers, unhandled):
    procs, _, _ = workers
    mesh = procs.spawn("survivors", SurvivingWorker, "t")
    mesh.slice(gpus=2).fail.broadcast()
    assert wait_until(lambda: unhandled, BOUND_S)
    failure, owner = unhandled[0]
    assert (failure.kind, failure.meshes, failure.ranks, failure.endpoint, owner) == (
        "endpoint_failed", ("survivors",), (2,), "fail", None)
    assert "ValueError: bad batch" in failure.why and "bad batch" in failure.traceback
    with pytest.raises(SupervisionError, match="broadcast fail raised ValueError: bad batch") as info:
        mesh.count.call()
    assert info.value.events == [failure]
    # Raised once; the actor lives on with its state.
    assert mesh.count.call().get(timeout=30).values() == [("t", 1)] * 4


@pytest.mark.parametrize("how, cause, status", [  # status: Monarch's words, which its programs match
    ("os._exit", "exited with code 7", "exited with non-zero code 7"),
    ("SIGKILL", "killed by SIGKILL", "failed: Killed(sig=9)"),
    ("SIGSEGV", "killed by SIGSEGV", "failed: Killed(sig=11)"),
])
def test_a_dying_proc_fails_its_calls_fast_and_the_other_ranks_stay_healthy(workers, unhandled, tmp_path, how,
                                                                           cause, status):
    procs, mesh, pids = workers
    victim = mesh.slice(gpus=1)
    started = time.monotonic()
    if how == "os._exit":
        pending = victim.exit_now.call_one(7)
    elif how == "SIGSEGV":
        pending = victim.segfault.call_one()
    else:
        pending = victim.barrier.call_one(str(tmp_path), 99)  # busy when it is killed
        os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(SupervisionError, match=cause) as info:
        pending.get(timeout=30)
    assert time.monotonic() - started < BOUND_S
    assert f"pid {pids[1]}" in str(info.value) and "workers rank 1" in str(info.value)
    if how == "SIGSEGV":  # the proc's last stderr lines say where it crashed
        assert "Segmentation fault" in str(info.value)
    assert f"the process this actor was running on {status}" in str(info.value)
    assert wait_until(lambda: unhandled, BOUND_S) and unhandled[0][0].kind == "proc_failed"
    # Monarch reports a proc's death as the deaths of the actors it ran, with its status.
    report = unhandled[0][0].report()
    assert report.startswith("The actor test_failures.Worker workers{'gpus': 1/4} and all its descendants "
                             "have failed:"), report
    assert f"the process this actor was running on {status}; proc " in report and cause in report, report
    healthy = mesh.slice(gpus=slice(2, 4))
    assert healthy.count.call().get(timeout=30).values() == [("t", 1)] * 2
    tree = procs._hub().request("health", timeout=30)
    states = {p["pid"]: p["state"] for h in tree["hosts"] for p in h["procs"]}
    assert states[pids[1]] == "failed" and states[pids[0]] == states[pids[2]] == "healthy"


def test_ranks_blocked_in_a_collective_fail_at_once_when_one_of_them_dies(workers, tmp_path):
    procs, mesh, pids = workers
    pending = mesh.barrier.call(str(tmp_path), 4 + 1)  # never complete: a barrier that hangs
    assert wait_until(lambda: len(os.listdir(tmp_path)) == 4, BOUND_S)
    started = time.monotonic()
    os.kill(pids[3], signal.SIGKILL)
    with pytest.raises(SupervisionError, match="workers rank 3"):
        pending.get(timeout=30)
    assert time.monotonic() - started < BOUND_S


def test_an_init_that_raises_fails_the_spawn_when_asked(host):
    procs = host.spawn_procs(per_host={"gpus": 2}, name="badinit")
    try:
        with pytest.raises(ActorError, match="no GPU here") as info:
            procs.spawn("badinit", BadInit, raise_init_errors=True)
        assert len(info.value.failures) == 2
        assert procs.spawn("fine", Worker).count.call().get(timeout=30).values() == [("w", 1)] * 2
    finally:
        procs.stop()


# __supervise__ ---------------------------------------------------------------------------
class Supervisor(Actor):
    """Spawns a child mesh and decides about its failures."""

    def __init__(self, verdict: str):
        self.verdict = verdict
        self.failures: list[str] = []

    @endpoint
    def start_children(self, name: str) -> list[int]:
        procs = this_host().spawn_procs(per_host={"gpus": 2}, name=name)
        self.children = procs.spawn(name, Worker, "child")
        return self.children.pid.call().get(timeout=30).values()

    @endpoint
    def seen(self) -> list[str]:
        return self.failures

    def __supervise__(self, failure: MeshFailure):
        self.failures.append(f"{failure.kind} {failure.meshes} {failure.ranks}")
        if self.verdict == "raise":
            raise RuntimeError("supervisor broke")
        return self.verdict == "handle"


class Bystander(Supervisor):
    """Has no ``__supervise__``: every failure of its children is unhandled."""

    __supervise__ = None


class SurvivingSupervisor(Supervisor):
    """The notebook option: an unhandled child failure leaves the owner alive."""

    survive_unhandled_children = True


@pytest.mark.parametrize("verdict", ["handle", "pass", "raise", "absent"])
def test_supervise_handles_a_child_failure_or_dies_of_it_and_the_failure_goes_up(host, unhandled, verdict):
    procs = host.spawn_procs(per_host={"gpus": 1}, name=f"sup-{verdict}")
    try:
        boss = procs.spawn("boss", Bystander if verdict == "absent" else Supervisor, verdict)
        children = boss.start_children.call_one(f"kids-{verdict}").get(timeout=60)
        os.kill(children[1], signal.SIGKILL)
        seen = [f"proc_failed ('kids-{verdict}',) (1,)"]
        if verdict == "handle":
            # Handled: the client hears nothing, and calls on the owner go on.
            assert wait_until(lambda: boss.seen.call_one().get(timeout=30), BOUND_S) == seen
            assert not unhandled
            return
        # Unhandled: the owner dies of it (Monarch), and its failure reaches the client
        # naming the child's.
        assert wait_until(lambda: unhandled, BOUND_S)
        [(failure, owner)] = unhandled
        assert (failure.kind, failure.meshes, failure.ranks, failure.endpoint, owner) == (
            "actor_failed", ("boss",), (0,), "__supervise__", None)
        # The child's proc death, as Monarch reports it: its actor's death, naming the proc.
        assert (f"a failure of kids-{verdict}: The actor test_failures.Worker kids-{verdict}{{'gpus': 1/2}} and all "
                f"its descendants have failed:") in failure.why
        assert f"Killed(sig=9); proc kids-{verdict}/1" in failure.why
        assert ("__supervise__ raised RuntimeError: supervisor broke" in failure.why) == (verdict == "raise")
        for _ in range(2):  # the owner is dead: every later call fails
            with pytest.raises(SupervisionError, match=rf"(?s)The actor .*boss\{{'gpus': 0/1\}} and all its descendants have "
                                                       rf"failed.*kids-{verdict}/1"):
                boss.seen.call_one().get(timeout=30)
    finally:
        procs.stop()
        host._hub().request("stop_procs", name=f"kids-{verdict}")


class AsyncBystander(Actor):
    """An async owner without ``__supervise__``: it dies of a child's failure while a
    call of it awaits (its supervision runs during the await)."""

    @endpoint
    async def start_children(self, name: str) -> list[int]:
        procs = this_host().spawn_procs(per_host={"gpus": 2}, name=name)
        self.children = procs.spawn(name, Worker, "child")
        return (await self.children.pid.call()).values()

    @endpoint
    async def outlive(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        await asyncio.Event().wait()  # until stopped: only the owner's death can end the call


def test_a_call_running_when_its_owner_dies_of_a_child_failure_raises(host, unhandled):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="sup-async")
    try:
        boss = procs.spawn("boss", AsyncBystander)
        children = boss.start_children.call_one("kids-async").get(timeout=60)
        with pytest.raises(SupervisionError, match=r"(?s)boss.*and all its descendants have failed.*kids-async/1"):
            boss.outlive.call_one(children[1]).get(timeout=30)
    finally:
        procs.stop()
        host._hub().request("stop_procs", name="kids-async")


@pytest.mark.parametrize("verdict", ["pass", "raise"])
def test_an_owner_that_survives_unhandled_children_lives_and_its_next_call_raises_it(host, unhandled, verdict):
    procs = host.spawn_procs(per_host={"gpus": 1}, name=f"keep-{verdict}")
    try:
        boss = procs.spawn("boss", SurvivingSupervisor, verdict)
        children = boss.start_children.call_one(f"kept-{verdict}").get(timeout=60)
        os.kill(children[1], signal.SIGKILL)
        assert wait_until(lambda: unhandled, BOUND_S)
        failure, owner = unhandled[0]
        assert owner["mesh"] == "boss" and failure.meshes == (f"kept-{verdict}",)
        assert "not handled by boss rank 0" in failure.why
        assert ("__supervise__ raised RuntimeError: supervisor broke" in failure.why) == (verdict == "raise")
        with pytest.raises(SupervisionError, match=f"kept-{verdict}/1"):
            boss.seen.call_one()
        # Raised once; the owner lives on, and it was asked first.
        assert boss.seen.call_one().get(timeout=30) == [f"proc_failed ('kept-{verdict}',) (1,)"]
    finally:
        procs.stop()
        host._hub().request("stop_procs", name=f"kept-{verdict}")


# restarts --------------------------------------------------------------------------------
def test_restart_failed_respawns_only_dead_procs_and_keeps_healthy_state(workers):
    procs, mesh, pids = workers
    assert mesh.count.call().get(timeout=30).values() == [("t", 1)] * 4
    os.kill(pids[2], signal.SIGKILL)
    with pytest.raises(SupervisionError):
        mesh.count.call().get(timeout=30)
    assert procs.restart_failed() == [2]
    # Rank 2 is new (constructor arguments again, fresh state); the others kept theirs.
    assert mesh.count.call().get(timeout=30).values() == [("t", 3), ("t", 3), ("t", 1), ("t", 3)]
    new = mesh.pid.call().get(timeout=30).values()
    assert new[2] != pids[2] and [new[i] for i in (0, 1, 3)] == [pids[i] for i in (0, 1, 3)]
    assert procs.restart_failed() == []  # nothing failed: nothing to do
    tree = procs._hub().request("health", timeout=30)
    assert all(p["state"] == "healthy" for h in tree["hosts"] for p in h["procs"] if p["pid"] in new)


def test_restart_with_no_ranks_restarts_an_actor_that_died_while_its_proc_lives_on(cluster, workers, unhandled):
    # Only failed procs were restarted: an actor dead of SystemExit stayed dead, though the
    # error said "restart() on actor mesh 'workers' restarts its failed ranks".
    procs, mesh, pids = workers
    with pytest.raises(SupervisionError):
        mesh.slice(gpus=1).give_up.call_one().get(timeout=30)
    # health() shows it failed, with why, though its proc is healthy (it showed healthy)
    node = _health_of(cluster, mesh)
    assert node["state"] == "failed" and node["alive"] == 3, node
    assert "SystemExit" in node["actors"][1]["died"] and node["actors"][0]["state"] == "healthy"
    assert mesh.restart() == [1]
    assert mesh.count.call().get(timeout=30).values() == [("t", 1)] * 4
    assert mesh.pid.call().get(timeout=30).values()[1] != pids[1]
    assert mesh.restart() == []  # nothing failed: nothing to do
    assert _health_of(cluster, mesh)["state"] == "healthy"


def _health_of(cluster, mesh) -> dict:
    """``mesh``'s node in ``cluster``'s health tree."""
    (node,) = [m for m in cluster.health()["actor_meshes"] if m["key"] == mesh._key]
    return node


def test_restart_right_after_the_call_that_saw_an_actor_die_restarts_it(workers, unhandled, monkeypatch):
    # The call's reply says the actor died; the hub's news of it comes on another socket,
    # later on a loaded machine (CI): restart() then found no failed rank. Here it never comes.
    from monarch_nb.client.runtime import runtime

    procs, mesh, pids = workers
    monkeypatch.setattr(runtime().supervision, "actors_gone", lambda event: None)
    with pytest.raises(SupervisionError):
        mesh.slice(gpus=1).give_up.call_one().get(timeout=30)
    assert mesh.restart() == [1]
    monkeypatch.undo()
    assert mesh.count.call().get(timeout=30).values() == [("t", 1)] * 4


def test_restarting_a_live_rank_fails_its_pending_call_and_serves_again(workers, tmp_path):
    procs, mesh, pids = workers
    pending = mesh.slice(gpus=0).barrier.call_one(str(tmp_path), 99)
    assert mesh.restart([0]) == [0]
    with pytest.raises(SupervisionError, match="was restarted"):
        pending.get(timeout=30)
    assert mesh.slice(gpus=0).count.call_one().get(timeout=30) == ("t", 1)
    with pytest.raises(IndexError, match="ranks 0-3"):
        mesh.restart([4])


def test_a_restart_whose_init_raises_again_reports_it_and_keeps_the_other_meshes(workers, tmp_path, unhandled):
    # The proc was stopped again: one mesh's __init__ kept every other mesh there failed.
    procs, mesh, pids = workers
    flag = tmp_path / "flag"
    fussy = procs.spawn("fussy", InitFailsIf, str(flag))
    flag.touch()
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(SupervisionError):
        mesh.count.call().get(timeout=30)
    with pytest.raises(ActorError, match="is there") as info:
        procs.restart_failed()
    message = str(info.value)
    assert [str(p) for p in info.value.points] == ["{'gpus': 1/4}"] and "restarting" in message
    assert "restarted proc rank 1" in message and "back: workers" in message, message
    assert "fussy stays failed there: stop it (fussy.stop())" in message, message
    # The healthy mesh serves on the new proc; the broken one's actor there fails at once.
    assert mesh.slice(gpus=1).count.call_one().get(timeout=30) == ("t", 1)
    tree = procs._hub().request("health", timeout=30)
    [node] = [p for h in tree["hosts"] for p in h["procs"] if p["proc_mesh"] == procs._name and p["rank"] == 1]
    assert node["state"] == "healthy" and node["pid"] != pids[1]
    with pytest.raises(SupervisionError, match="fussy rank 1: __init__ raised RuntimeError"):
        fussy.slice(gpus=1).pid.call_one().get(timeout=30)
    # Once its __init__ can succeed, restarting that rank brings it back.
    flag.unlink()
    assert fussy.restart([1]) == [1]
    assert fussy.pid.call().get(timeout=30).values()[1] != pids[1]
    assert mesh.slice(gpus=1).count.call_one().get(timeout=30) == ("t", 1)


def test_a_mesh_whose_init_failed_at_spawn_does_not_keep_restart_failed_from_the_healthy_ones(workers, unhandled):
    # Every restart re-created the broken mesh, failed and stopped the new proc again.
    procs, mesh, pids = workers
    broken = procs.spawn("broken", BadInit)  # a fault on every rank; the mesh lives on (Monarch)
    assert wait_until(lambda: unhandled, BOUND_S)
    os.kill(pids[2], signal.SIGKILL)
    with pytest.raises(SupervisionError):
        mesh.count.call().get(timeout=30)
    for attempt in range(2):  # and again, after the new proc died too
        with pytest.raises(ActorError, match="no GPU here") as info:
            procs.restart_failed()
        assert "broken stays failed there: stop it (broken.stop())" in str(info.value), str(info.value)
        assert mesh.slice(gpus=2).count.call_one().get(timeout=30) == ("t", 1)
        assert procs.restart_failed() == []  # nothing is left failed: no proc to restart
        if attempt == 0:
            os.kill(mesh.slice(gpus=2).pid.call_one().get(timeout=30), signal.SIGKILL)
            assert wait_until(lambda: procs._hub().request("health", timeout=30)["counts"]["failed"] == 1, 30)
    broken.stop()
    os.kill(mesh.slice(gpus=2).pid.call_one().get(timeout=30), signal.SIGKILL)
    assert wait_until(lambda: procs._hub().request("health", timeout=30)["counts"]["failed"] == 1, 30)
    assert procs.restart_failed() == [2]  # nothing broken is left: a plain restart


def test_calls_to_a_stopped_actor_mesh_fail_at_once(workers):
    procs, mesh, pids = workers
    other = procs.spawn("other", Worker)
    other.stop()
    with pytest.raises(SupervisionError, match="its actor mesh was stopped"):
        other.count.call().get(timeout=30)
    assert mesh.count.call().get(timeout=30).values() == [("t", 1)] * 4


def test_a_broadcast_to_a_stopped_actor_mesh_raises_what_a_call_raises(workers):
    # It was dropped without a word.
    procs, mesh, pids = workers
    other = procs.spawn("other", Worker)
    other.stop()
    with pytest.raises(SupervisionError, match="its actor mesh was stopped") as called:
        other.count.call().get(timeout=30)
    with pytest.raises(SupervisionError, match="its actor mesh was stopped") as broadcast:
        other.count.broadcast()
    assert str(broadcast.value) == str(called.value)


def test_a_broadcast_to_a_mesh_with_a_dead_rank_runs_on_the_others_then_raises_what_a_call_raises(workers, unhandled):
    procs, mesh, pids = workers
    mesh.slice(gpus=2).fail.broadcast()  # rank 2's actor dies of it
    assert wait_until(lambda: unhandled, BOUND_S)
    for _ in range(2):
        with pytest.raises(SupervisionError) as called:
            mesh.count.call().get(timeout=30)
    with pytest.raises(SupervisionError) as broadcast:
        mesh.count.broadcast()
    assert str(broadcast.value) == str(called.value)
    assert broadcast.value.__notes__[-1] == "broadcast: sent to the 3 other ranks"
    assert mesh.slice(gpus=slice(0, 2)).count.call().get(timeout=30).values() == [("t", 4)] * 2


def test_a_call_to_a_stopped_proc_mesh_names_every_rank(host):
    procs = host.spawn_procs(per_host={"gpus": 3}, name="stopall")
    mesh = procs.spawn("stopall", Worker)
    procs.stop()
    with pytest.raises(SupervisionError, match="3 of 3 rank") as info:
        mesh.count.call().get(timeout=30)
    assert "was stopped" in str(info.value) and "its proc was stopped" not in str(info.value)


@pytest.mark.parametrize("call, error, message", [
    (lambda h: h.spawn_procs(per_host={"gpus": 1}, name="a/b"), ValueError, "mesh name 'a/b'"),
    (lambda h: h.spawn_procs(per_host={"gpus": 1}, name=123), ValueError, "mesh name 123"),
    (lambda h: h.spawn_procs(per_host=[2]), TypeError, "per_host must be a dict"),
    (lambda h: set_failure_hook(42), TypeError, "needs a function"),
])
def test_bad_supervision_and_spawn_arguments_are_refused_clearly(host, call, error, message):
    try:
        with pytest.raises(error, match=message):
            call(host)
    finally:
        set_failure_hook(None)
    assert host._hub().request("health", timeout=30)["counts"]["failed"] == 0


def test_meshes_an_actor_spawned_are_stopped_when_it_dies(host, unhandled):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="parent-procs")
    try:
        boss = procs.spawn("orphaner", Supervisor, "handle")
        children = boss.start_children.call_one("orphans").get(timeout=60)
        assert pids_alive(children) == children
        os.kill(procs.pids[0], signal.SIGKILL)
        # No owner is left to use or supervise them: they go too, with their processes.
        assert wait_until(lambda: not pids_alive(children), BOUND_S + 5)
        info = host._hub().request("info", timeout=30)
        assert "orphans" not in info["proc_meshes"] and "orphans" not in info["actor_meshes"]
    finally:
        procs.stop()
