"""How supervision words what it reports: ours names mesh, rank, pid and cause, inside
Monarch's phrases (``Endpoint call M.E() failed,``, ``The actor ... and all its
descendants have failed``, ``MeshFailure(mesh_name=..., crashed_ranks=[...]``), which
programs written for Monarch match."""

from __future__ import annotations

import os
import re
import signal

import pytest

from monarch_nb.actor import Actor, MeshFailure, SupervisionError, endpoint
from monarch_nb.errors import actor_name


class Fragile(Actor):
    @endpoint
    def leave(self) -> None:
        raise SystemExit(3)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


CLASS = f"{__name__}.Fragile"


def test_an_actor_killed_by_a_base_exception_fails_calls_with_monarchs_report(host):
    procs = host.spawn_procs(per_host={"gpus": 2}, name="reports-exit")
    try:
        mesh = procs.spawn("leaver", Fragile)
        with pytest.raises(RuntimeError) as info:  # SupervisionError is one, as in Monarch
            mesh.slice(gpus=1).leave.call_one().get(timeout=30)
        assert isinstance(info.value, SupervisionError)
        assert str(info.value) == (
            f"Endpoint call leaver.leave() failed, The actor {CLASS} leaver{{'gpus': 1/2}} and all its "
            "descendants have failed:\n  leaver rank 1: leave raised SystemExit: 3")
        with pytest.raises(SupervisionError) as info:
            mesh.pid.call().get(timeout=30)
        # (str() alone: pytest's match= also reads the PEP 678 note saying how to recover)
        assert re.fullmatch(r"(?s)Endpoint call leaver.pid\(\) failed, The actor .*leaver\{'gpus': 1/2\} and all its "
                            r"descendants have failed:\n  leaver rank 1: leave raised SystemExit: 3\n\(1 of 2 ranks\)",
                            str(info.value)), str(info.value)
    finally:
        procs.stop()


def test_an_actor_whose_proc_was_killed_fails_calls_naming_the_actor_and_the_proc(host):
    procs = host.spawn_procs(per_host={"gpus": 2}, name="reports-kill")
    try:
        mesh = procs.spawn("victims", Fragile)
        os.kill(procs.pids[0], signal.SIGKILL)
        with pytest.raises(SupervisionError) as info:
            mesh.pid.call().get(timeout=30)
        text = str(info.value)
        assert text.startswith(f"Endpoint call victims.pid() failed, The actor {CLASS} victims{{'gpus': 0/2}} and "
                               f"all its descendants have failed:\n  victims rank 0: the process this actor was "
                               f"running on failed: Killed(sig=9); proc reports-kill/0 "
                               f"(pid {procs.pids[0]} on "), text
        assert "killed by SIGKILL" in text and text.endswith("\n(1 of 2 ranks)"), text
    finally:
        procs.stop()


def test_a_stopped_actor_fails_calls_saying_its_status_is_stopped(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="reports-stop")
    try:
        mesh = procs.spawn("stopped", Fragile)
        mesh.stop()
        with pytest.raises(SupervisionError) as info:
            mesh.pid.call_one().get(timeout=30)
        assert str(info.value) == (f"Endpoint call stopped.pid() failed, Supervision event: actor {CLASS} "
                                   "stopped{'gpus': 0/1} has status:\n  stopped: stopped rank 0: its actor mesh "
                                   "was stopped")
    finally:
        procs.stop()


def test_spawning_on_a_stopped_proc_mesh_says_it_has_already_been_stopped(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="reports-gone")
    procs.stop()
    with pytest.raises(RuntimeError, match="`ProcMesh` has already been stopped: proc mesh 'reports-gone' is gone"):
        procs.spawn("late", Fragile)


def test_a_mesh_failure_reads_as_monarchs_with_our_cause():
    failure = MeshFailure("actor_failed", ("workers",), (3,), "workers rank 3: step raised SystemExit: 1")
    assert str(failure) == ("MeshFailure(mesh_name=workers, crashed_ranks=[3], "
                            "event=workers rank 3: step raised SystemExit: 1)")
    assert failure.mesh_name == "workers"
    assert MeshFailure("proc_failed", (), (), "proc p/0 exited", proc_mesh="p", rank=0).mesh_name == "p"


def test_an_actor_is_named_by_class_mesh_and_each_dimensions_index_of_size():
    assert actor_name("m.C", "trainers", {"hosts": 2, "gpus": 4}, 5) == "m.C trainers{'hosts': 1/2, 'gpus': 1/4}"
    assert actor_name("m.C", "ctl", {}, 0) == "m.C ctl{}"


def test_an_unhandled_failure_is_reported_by_clients_not_by_actors_that_joined_the_hub(monkeypatch):
    # An actor that once called another mesh joined the hub to hear of deaths, and then
    # printed every unhandled failure of the cluster as its own ("[actor_0 1] monarch_nb:
    # unhandled failure: ... d ..."), under whichever cell it last served (4 of 4).
    from monarch_nb.client import supervision as client_supervision
    from monarch_nb.protocol import envelope, events

    event = {envelope.OP: events.SUPERVISION, events.CLUSTER: "c1",
             "failure": {"kind": "proc_failed", "meshes": ["d"], "ranks": [1], "why": "d rank 1: exited with code 7"}}
    for identity, told in ((None, 1), ({"cluster_dir": "/nowhere", "proc_id": "procs1/1"}, 0)):
        heard: list = []
        watcher = client_supervision.Supervision(lambda: None)
        watcher.set_failure_hook(lambda cluster, failure, owner: heard.append((cluster, failure.meshes)))
        monkeypatch.setattr(client_supervision, "proc_identity", lambda identity=identity: identity)
        watcher.on_event(event)
        assert heard == [("c1", ("d",))] * told
