"""The hub's state on disk: changes go to a journal written off the event loop, a
burst of changes costs a few writes, a hub killed at any byte of a write leaves state a
recovering hub loads, and a recovered hub finds every mesh whose spawn was answered."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading

import monarch_nb
from monarch_nb import cluster_dir
from monarch_nb.client.runtime import runtime
from monarch_nb.errors import ClusterError
from monarch_nb.hub import state
from monarch_nb.hub.records import ActorMeshRecord, ProcMeshRecord, ProcRecord
from monarch_nb.hub.registry import Registry

from conftest import cluster_processes, pids_alive, wait_until
from sample_actors import Counter


class _Allocator:
    def spec(self) -> dict:
        return {"kind": "local"}


class _Announcer:
    def health_changed(self) -> None:
        pass


def _mesh(name: str, n: int) -> ProcMeshRecord:
    return ProcMeshRecord(name, {"gpus": n}, [ProcRecord(f"{name}/{r}", "host0", f"tcp://127.0.0.1:{r}", 1000 + r)
                                              for r in range(n)])


def _actors(name: str, proc_mesh: ProcMeshRecord) -> ActorMeshRecord:
    n = len(proc_mesh.procs)
    return ActorMeshRecord(name, proc_mesh.name, list(range(n)), {"gpus": n}, "Counter", {"incr": False}, [],
                           [f"tcp://a/{r}" for r in range(n)], f"payload-{name}")


def _summary(saved: dict | None) -> dict:
    """What a recovering hub would take over, comparable."""
    assert saved is not None
    return {"procs": {n: [(p.proc_id, p.pid, p.exit_code) for p in m.procs] for n, m in saved["proc_meshes"].items()},
            "actors": sorted(saved["actor_meshes"]), "counter": saved["mesh_counter"]}


def _stop_retained(name: str, path) -> None:
    """Stop retained cluster ``name`` as a user would (the CLI), wait for its processes to
    end, and drop this client's connection to it."""
    subprocess.run([sys.executable, "-m", "monarch_nb.cli", "cluster", "stop", name], capture_output=True)
    assert wait_until(lambda: not cluster_processes(path), 30), cluster_processes(path)
    if runtime().cluster is not None:
        runtime().cluster.disconnect()
        runtime().cluster = None


def test_a_burst_of_256_proc_deaths_is_written_off_the_event_loop_in_a_few_fsyncs(tmp_path, monkeypatch):
    fsyncs: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(threading.current_thread().name), real_fsync(fd)))

    async def main() -> None:
        registry = Registry(tmp_path, False, _Allocator(), _Announcer(), None)
        mesh = registry.proc_meshes["big"] = _mesh("big", 2048)
        await registry.save(mesh)
        assert registry.writer is not None
        snapshots = registry.writer.snapshots
        fsyncs.clear()
        done = []
        for proc in mesh.procs[:256]:  # a preempted host: its agent reports each exit
            found = registry.find_proc(proc.proc_id)
            assert found is not None and found[2] is proc
            proc.exit_code = -9
            done.append(registry.save(proc))
        await asyncio.wait_for(asyncio.gather(*done), 60)
        assert threading.main_thread().name not in fsyncs, "the event loop waited for the disk"
        assert len(fsyncs) <= 2, fsyncs  # one write for the burst, not 256 rewrites of all 2,048 procs
        assert registry.writer.snapshots == snapshots
        registry.close()

    asyncio.run(main())
    exits = [p.exit_code for p in state.load(tmp_path)["proc_meshes"]["big"].procs]
    assert exits == [-9] * 256 + [None] * (2048 - 256)


def test_state_loads_after_a_hub_killed_at_any_byte_of_a_journal_write(tmp_path):
    """Every prefix of the journal (a SIGKILL mid-write) loads as the state after its
    last whole line: never an error, never a change half applied."""
    expected: list[dict] = []

    async def main() -> None:
        registry = Registry(tmp_path, False, _Allocator(), _Announcer(), None)
        a = registry.proc_meshes["a"] = _mesh("a", 3)
        await registry.save()
        expected.append(_summary(state.load(tmp_path)))
        b = registry.proc_meshes["b"] = _mesh("b", 2)
        registry.next_number()

        def exited(rank: int) -> ProcRecord:
            a.procs[rank].exit_code = -9
            return a.procs[rank]

        changes = [lambda: b, lambda: registry.actor_meshes.setdefault("a/c", _actors("c", a))]
        changes += [lambda rank=rank: exited(rank) for rank in range(3)]
        changes += [lambda: registry.actor_meshes.pop("a/c"), lambda: registry.proc_meshes.pop("a")]
        for change in changes:  # each awaited: one line each
            await registry.save(change())
            expected.append(_summary(state.load(tmp_path)))
        assert registry.writer is not None and registry.writer.snapshots == 1  # each change a line
        registry.close()

    asyncio.run(main())
    assert len({str(e) for e in expected}) == len(expected)  # each change shows
    journal = next(tmp_path.glob("state.*.journal"))
    data = journal.read_bytes()
    assert data.count(b"\n") == len(expected) - 1
    cut = tmp_path / "cut"
    cut.mkdir()
    shutil.copy(tmp_path / state.STATE_FILE, cut / state.STATE_FILE)
    for end in range(len(data) + 1):
        (cut / journal.name).write_bytes(data[:end])
        assert _summary(state.load(cut)) == expected[data[:end].count(b"\n")], end


def test_find_proc_follows_meshes_stopped_and_spawned_again_under_the_same_name(tmp_path):
    async def main() -> None:
        registry = Registry(tmp_path, True, _Allocator(), _Announcer(), None)
        first = registry.proc_meshes["p"] = _mesh("p", 4)
        registry.save(first)
        assert registry.find_proc("p/2")[2] is first.procs[2]
        del registry.proc_meshes["p"]
        registry.save(first)
        assert registry.find_proc("p/2") is None
        again = registry.proc_meshes["p"] = _mesh("p", 2)
        registry.save(again)
        assert registry.find_proc("p/1")[2] is again.procs[1] and registry.find_proc("p/2") is None
        again.procs[1] = ProcRecord("p/1", "host0", "tcp://new", 4242)  # a restart
        assert registry.find_proc("p/1")[2].pid == 4242

    asyncio.run(main())


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monarch_nb.cli", *args], capture_output=True, text=True,
                          timeout=180)


def test_a_hub_killed_during_a_burst_of_changes_recovers_every_answered_spawn():
    name = "journal-burst"
    path = cluster_dir.cluster_path(name)
    try:
        cluster = monarch_nb.Cluster.start(name, grace_s=60)
        keep = cluster.host_mesh().spawn_procs(per_host={"gpus": 2}, name="keep")
        counters = keep.spawn("counters", Counter, 3)
        counters.incr.call(4).get()
        doomed = cluster.host_mesh().spawn_procs(per_host={"gpus": 12}, name="doomed")
        for pid in doomed.pids:  # 12 exits for the hub to write while it answers spawns
            os.kill(pid, signal.SIGKILL)
        answered = [keep.spawn(f"late{i}", Counter, i) for i in range(3)]
        os.kill(cluster._info["hub_pid"], signal.SIGKILL)  # right after the last spawn's reply
        assert wait_until(lambda: not pids_alive([cluster._info["hub_pid"]]), 30)
        runtime().cluster = None

        recovered = _cli("cluster", "recover", name)
        assert recovered.returncode == 0, recovered.stdout + recovered.stderr
        again = monarch_nb.connect(name)
        assert again.proc_meshes["keep"].pids == keep.pids
        assert sorted(again.actor_meshes["counters"].get.call().get().values()) == [7, 7]
        for i, mesh in enumerate(answered):
            assert sorted(again.actor_meshes[f"late{i}"].get.call().get().values()) == [i, i]
        assert "doomed" not in again.proc_meshes  # every proc of it died: forgotten, not left failed
        again.stop()
        assert not pids_alive(keep.pids + doomed.pids)
    finally:
        _stop_retained(name, path)
    assert not path.exists(), f"{path} left behind"


def _consistent(cluster) -> list[str]:
    """Procs the hub's view gets wrong: listed live but gone, or listed exited but running."""
    wrong = []
    for mesh in cluster.info()["proc_meshes"].values():
        for proc in mesh["procs"]:
            if (proc["exit_code"] is None) != bool(pids_alive([proc["pid"]])):
                wrong.append(f"{proc['proc_id']} pid {proc['pid']} exit_code {proc['exit_code']}")
    return wrong


def test_a_hub_killed_while_meshes_are_spawned_and_stopped_recovers_every_answered_change():
    """The hub is SIGKILLed at a moment it does not choose (its journal's Nth line) while
    a client spawns and stops proc meshes one after another: the recovered hub lists
    every mesh whose spawn was answered and not stopped, with the same procs, none whose
    stop was answered, and what it lists as live is live; a proc that dies afterwards is
    restarted from the constructor arguments it reads back from disk."""
    name = "journal-churn"
    path = cluster_dir.cluster_path(name)
    spawned: dict[str, list[int]] = {}  # spawn answered, not stopped
    stopped: set[str] = set()  # stop answered
    every_pid: list[int] = []
    try:
        cluster = monarch_nb.Cluster.start(name, grace_s=60)
        hub_pid = cluster._info["hub_pid"]
        keep = cluster.host_mesh().spawn_procs(per_host={"gpus": 2}, name="keep")
        counters = keep.spawn("counters", Counter, 3)
        counters.incr.call(4).get()

        def lines() -> int:
            return sum(f.read_bytes().count(b"\n") for f in path.glob("state.*.journal"))

        kill_at = lines() + 7  # in the middle of the spawns and stops below
        killer = threading.Thread(target=lambda: wait_until(lambda: lines() >= kill_at, 120, 0.005)
                                  and os.kill(hub_pid, signal.SIGKILL), daemon=True)
        killer.start()
        previous = None
        for i in range(40):
            try:
                mesh = cluster.host_mesh().spawn_procs(per_host={"gpus": 1}, name=f"churn{i}")
                every_pid.extend(mesh.pids)
                spawned[f"churn{i}"] = mesh.pids
                if previous is not None:  # every other mesh is stopped again
                    previous[1].stop()
                    del spawned[previous[0]]
                    stopped.add(previous[0])
                    previous = None
                else:
                    previous = (f"churn{i}", mesh)
            except ClusterError:
                break  # the hub is gone: this change was not answered
        killer.join(10)
        assert not pids_alive([hub_pid]), "the hub was never killed"
        assert stopped and spawned, (stopped, spawned)
        runtime().cluster = None

        recovered = _cli("cluster", "recover", name)
        assert recovered.returncode == 0, recovered.stdout + recovered.stderr
        again = monarch_nb.connect(name)
        for mesh_name, pids in spawned.items():
            assert again.proc_meshes[mesh_name].pids == pids, mesh_name
        assert not stopped & set(again.info()["proc_meshes"])
        assert sorted(again.actor_meshes["counters"].get.call().get().values()) == [7, 7]
        assert wait_until(lambda: not _consistent(again), 20), _consistent(again)
        os.kill(keep.pids[0], signal.SIGKILL)  # restarted from the constructor the recovered hub reads from disk
        assert wait_until(lambda: again.health()["counts"]["failed"] == 1, 20)
        assert again.proc_meshes["keep"].restart_failed() == [0]
        assert sorted(again.actor_meshes["counters"].get.call().get().values()) == [3, 7]
        every_pid.extend(again.proc_meshes["keep"].pids)
        again.stop()
        assert not pids_alive(keep.pids + every_pid)
    finally:
        _stop_retained(name, path)
    assert not path.exists(), f"{path} left behind"


# state.json as the hub wrote it before the journal (one whole rewrite per change, no
# "journal" field): a hub of this version started on it must take it over.
_PRE_JOURNAL_STATE = {
    "version": 1, "started": 1764900000.5, "mesh_counter": 7, "host_order": ["host0"],
    "allocator": {"kind": "local", "hosts": 1},
    "hosts": [{"host_id": "host0", "address": "tcp://127.0.0.1:5000", "pid": 4000, "hostname": "box",
               "node": ""}],
    "proc_meshes": [{"name": "trainers", "extent": {"gpus": 2}, "created": 1764900001.0,
                     "procs": [{"proc_id": f"trainers/{r}", "host_id": "host0", "address": f"tcp://127.0.0.1:{6000 + r}",
                                "pid": 4100 + r, "exit_code": None} for r in range(2)],
                     "owner": None, "launch": {}, "rank_env": {"0": {"RANK": "0"}}}],
    "actor_meshes": [{"name": "counters", "proc_mesh": "trainers", "proc_ranks": [0, 1], "extent": {"gpus": 2},
                      "class_name": "Counter", "endpoints": {"incr": False}, "methods": [],
                      "addresses": ["tcp://127.0.0.1:7000", "tcp://127.0.0.1:7001"], "payload_id": "p1",
                      "created": 1764900002.0, "owner": None}],
}


def test_payloads_no_actor_mesh_names_are_removed_unless_written_since(tmp_path):
    # A hub killed while it spawned an actor mesh left the constructor's payload (64 MB
    # for a 64 MB argument) until the cluster stopped; a recovering hub removes it.
    spawn = tmp_path / "spawn"
    spawn.mkdir()
    for name in ("kept.bin", "orphan.bin", ".half.tmp", "new.bin"):
        (spawn / name).write_bytes(b"x")
    for name in ("kept.bin", "orphan.bin", ".half.tmp"):
        os.utime(spawn / name, (1000.0, 1000.0))
    removed = state.drop_unreferenced_payloads(tmp_path, {"kept"}, before=2000.0)
    assert sorted(removed) == [".half.tmp", "orphan.bin"]
    assert sorted(p.name for p in spawn.iterdir()) == ["kept.bin", "new.bin"]
    assert state.drop_unreferenced_payloads(tmp_path / "none", set(), before=2000.0) == []


def test_a_state_file_from_before_the_journal_is_taken_over_and_journaled_on(tmp_path):
    import json

    (tmp_path / state.STATE_FILE).write_text(json.dumps(_PRE_JOURNAL_STATE))
    saved = state.load(tmp_path)
    assert saved is not None and saved["journal"] == 0 and saved["mesh_counter"] == 7
    assert [p.pid for p in saved["proc_meshes"]["trainers"].procs] == [4100, 4101]
    assert list(saved["actor_meshes"]) == ["trainers/counters"] and list(saved["hosts"]) == ["host0"]

    async def main() -> None:  # a recovering hub: takes the state over, then journals its changes
        registry = Registry(tmp_path, False, _Allocator(), _Announcer(), saved)
        registry.hosts, registry.host_order = saved["hosts"], saved["host_order"]
        registry.proc_meshes, registry.actor_meshes = saved["proc_meshes"], saved["actor_meshes"]
        await registry.save()
        found = registry.find_proc("trainers/1")
        assert found is not None
        found[2].exit_code = -9
        await registry.save(found[2])
        registry.close()

    asyncio.run(main())
    again = state.load(tmp_path)
    assert again is not None and again["journal"] >= 1 and again["started"] == 1764900000.5
    assert [p.exit_code for p in again["proc_meshes"]["trainers"].procs] == [None, -9]
    assert again["proc_meshes"]["trainers"].rank_env == {"0": {"RANK": "0"}}
    assert list(again["actor_meshes"]) == ["trainers/counters"]


def test_a_garbled_journal_line_ends_the_replay_there_and_lines_without_checksums_still_load(tmp_path):
    """A line the disk garbled (one byte changed, still valid JSON) is not applied, nor
    is anything after it; a journal written before lines had checksums is read whole."""
    async def main() -> None:
        registry = Registry(tmp_path, False, _Allocator(), _Announcer(), None)
        mesh = registry.proc_meshes["a"] = _mesh("a", 3)
        await registry.save()
        for rank in range(3):
            mesh.procs[rank].exit_code = -9
            await registry.save(mesh.procs[rank])
        registry.close()

    asyncio.run(main())
    journal = next(tmp_path.glob("state.*.journal"))
    lines = journal.read_bytes().splitlines(keepends=True)
    assert len(lines) == 3
    exits = lambda: [p.exit_code for p in state.load(tmp_path)["proc_meshes"]["a"].procs]  # noqa: E731
    assert exits() == [-9, -9, -9]
    journal.write_bytes(lines[0] + lines[1].replace(b'"exit_code": -9', b'"exit_code": -7') + lines[2])
    assert exits() == [-9, None, None]
    journal.write_bytes(b"".join(line.partition(b" ")[2] for line in lines))  # as written before checksums
    assert exits() == [-9, -9, -9]
