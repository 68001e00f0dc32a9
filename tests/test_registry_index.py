"""The registry's indexes (no processes): a proc death touches what it names, found by
id, never a walk over every mesh of the cluster, and the indexes follow meshes spawned,
stopped, restarted and spawned again under the same name."""

from __future__ import annotations

import asyncio

from monarch_nb.hub.mesh_ops import MeshOps
from monarch_nb.hub.records import ActorMeshRecord, ProcMeshRecord, ProcRecord
from monarch_nb.hub.registry import Registry
from monarch_nb.hub.supervision import Supervision
from monarch_nb.protocol import agent_ops


class _Allocator:
    def spec(self) -> dict:
        return {"kind": "local"}


class _Announcer:
    def __init__(self) -> None:
        self.events: list[dict] = []

    def health_changed(self) -> None:
        pass

    async def announce(self, event: dict) -> None:
        self.events.append(event)


class _Net:
    address = "tcp://127.0.0.1:1"

    def forget(self, address: str) -> None:
        pass


class _Store:
    def last(self, proc: str, stream: str, n: int, scan: int = 10_000) -> list:
        return []


class _Watched(dict):
    """A registry table that counts walks over all of it."""

    walks = 0

    def values(self):
        _Watched.walks += 1
        return super().values()

    def items(self):
        _Watched.walks += 1
        return super().items()

    def __iter__(self):
        _Watched.walks += 1
        return super().__iter__()


def _mesh(name: str, n: int, host: str = "host0", owner: dict | None = None) -> ProcMeshRecord:
    return ProcMeshRecord(name, {"gpus": n}, [ProcRecord(f"{name}/{r}", host, f"tcp://{name}/{r}", 1000 + r)
                                              for r in range(n)], owner=owner)


def _actors(name: str, proc_mesh: ProcMeshRecord, ranks: list[int], owner: dict | None = None) -> ActorMeshRecord:
    return ActorMeshRecord(name, proc_mesh.name, ranks, {"gpus": len(ranks)}, "Counter", {}, [],
                           [f"tcp://{proc_mesh.name}/{name}/{r}" for r in ranks], f"payload-{name}", owner=owner)


def test_a_proc_death_walks_no_table_of_the_registry(tmp_path):
    """proc_exited finds the proc, its actors and the meshes they owned by id: with 200
    meshes in the cluster it reads none of the registry's tables whole."""
    async def main() -> None:
        announcer = _Announcer()
        registry = Registry(tmp_path, True, _Allocator(), announcer, None)
        registry.proc_meshes, registry.actor_meshes = _Watched(), _Watched()
        for m in range(200):
            mesh = registry.proc_meshes[f"p{m}"] = _mesh(f"p{m}", 8)
            registry.actor_meshes[f"p{m}/w"] = _actors("w", mesh, list(range(8)))
        registry.save()
        supervision = Supervision(registry, _Net(), announcer, _Store(), MeshOps(registry, _Net(), announcer, None, None))
        assert registry.find_proc("p0/0") is not None  # (indexes built: once, as at a hub's start)
        _Watched.walks = 0
        victim = registry.proc_meshes["p123"].procs[5]
        await supervision.proc_exited({agent_ops.PROC_ID: victim.proc_id, "pid": victim.pid, "returncode": -9}, None)
        await asyncio.sleep(0)
        assert victim.exit_code == -9
        gone = [e["actors"] for e in announcer.events if "actors" in e]
        assert gone and list(gone[0]) == ["tcp://p123/w/5"]  # the one actor on it, found without a scan
        assert _Watched.walks == 0

    asyncio.run(main())


def test_indexes_follow_meshes_spawned_stopped_restarted_and_spawned_again(tmp_path):
    async def main() -> None:
        registry = Registry(tmp_path, True, _Allocator(), _Announcer(), None)
        first = registry.proc_meshes["p"] = _mesh("p", 4)
        registry.save(first)
        actors = registry.actor_meshes["p/a"] = _actors("a", first, [1, 3])
        registry.save(actors)
        assert registry.find_proc("p/2")[2] is first.procs[2]
        assert registry.actors_on("p", 3) == [(actors, 1)] and registry.actors_on("p", 2) == []
        assert [p.proc_id for _, _, p in registry.procs_on("host0")] == ["p/0", "p/1", "p/2", "p/3"]

        first.procs[3] = ProcRecord("p/3", "host1", "tcp://new", 4242)  # restarted on another host
        registry.save(first)
        assert registry.find_proc("p/3")[2].pid == 4242
        assert [p.proc_id for _, _, p in registry.procs_on("host1")] == ["p/3"]
        assert "p/3" not in [p.proc_id for _, _, p in registry.procs_on("host0")]

        del registry.proc_meshes["p"], registry.actor_meshes["p/a"]  # stopped
        registry.save(first)
        registry.save(actors)
        assert registry.find_proc("p/2") is None and registry.actors_on("p", 3) == []
        assert registry.procs_on("host0") == [] and registry.actor_meshes_of("p") == []

        again = registry.proc_meshes["p"] = _mesh("p", 2)  # the same name, spawned again
        registry.save(again)
        assert registry.find_proc("p/1")[2] is again.procs[1] and registry.find_proc("p/3") is None

    asyncio.run(main())


def test_a_table_changed_without_naming_its_records_is_indexed_again(tmp_path):
    """``save()`` without records (host events) and a recovering hub's tables, set
    whole, are indexed again at the next lookup."""
    async def main() -> None:
        registry = Registry(tmp_path, True, _Allocator(), _Announcer(), None)
        registry.proc_meshes["a"] = _mesh("a", 2)
        registry.save()
        assert registry.find_proc("a/1") is not None
        registry.proc_meshes = {"b": _mesh("b", 3, host="h2")}  # adoption of a saved state
        registry.actor_meshes = {}
        assert registry.find_proc("a/1") is None and registry.find_proc("b/2") is not None
        registry.proc_meshes["c"] = _mesh("c", 1, host="h2")
        registry.save()
        assert [p.proc_id for _, _, p in registry.procs_on("h2")] == ["b/0", "b/1", "b/2", "c/0"]

    asyncio.run(main())


def test_the_meshes_an_actor_owns_are_found_by_its_address_until_they_stop(tmp_path):
    async def main() -> None:
        registry = Registry(tmp_path, True, _Allocator(), _Announcer(), None)
        parent = registry.proc_meshes["parent"] = _mesh("parent", 1)
        registry.save(parent)
        owner = {"mesh": "boss", "rank": 0, "address": "tcp://boss/0"}
        child = registry.proc_meshes["child"] = _mesh("child", 2, owner=owner)
        registry.save(child)
        helpers = registry.actor_meshes["parent/h"] = _actors("h", parent, [0], owner=owner)
        registry.save(helpers)
        assert registry.owned_by({"tcp://boss/0", "tcp://other"}) == [child, helpers]
        assert registry.owned_by({"tcp://other"}) == []
        del registry.actor_meshes["parent/h"]
        registry.save(helpers)
        assert registry.owned_by({"tcp://boss/0"}) == [child]

    asyncio.run(main())


def test_a_failed_host_fails_its_procs_only_and_writes_their_lines_not_a_snapshot(tmp_path):
    """A preempted job's hosts fail one by one: each costs the lines of its own procs
    (found by host, no walk over every mesh), never a snapshot of the whole registry."""
    from monarch_nb.hub import state
    from monarch_nb.hub.records import HostRecord
    from monarch_nb.protocol.records import LOST_EXIT_CODE

    async def main() -> None:
        announcer = _Announcer()
        registry = Registry(tmp_path, False, _Allocator(), announcer, None)
        registry.proc_meshes, registry.actor_meshes = _Watched(), _Watched()
        for h in range(32):  # 256 procs, 8 per host
            registry.hosts[f"host{h}"] = HostRecord(f"host{h}", f"tcp://agent/{h}", 500 + h, f"node{h}")
            mesh = registry.proc_meshes[f"p{h}"] = _mesh(f"p{h}", 8, host=f"host{h}")
            registry.actor_meshes[f"p{h}/w"] = _actors("w", mesh, list(range(8)))
        await registry.save()
        supervision = Supervision(registry, _Net(), announcer, _Store(), MeshOps(registry, _Net(), announcer, None, None))
        assert registry.find_proc("p0/0") is not None and registry.writer is not None
        writer = registry.writer
        snapshots, _Watched.walks = writer.snapshots, 0
        await supervision.host_failed(registry.hosts["host5"], "its Slurm job was preempted")
        for _ in range(3):
            await asyncio.sleep(0)
        assert _Watched.walks == 0
        assert [p.exit_code for p in registry.proc_meshes["p5"].procs] == [LOST_EXIT_CODE] * 8
        assert all(p.exit_code is None for p in registry.proc_meshes["p6"].procs)
        registry.close()  # (writes what is pending)
        assert writer.snapshots == snapshots == 1 and writer.syncs >= 1

    asyncio.run(main())
    saved = state.load(tmp_path)
    assert saved is not None
    assert [p.exit_code for p in saved["proc_meshes"]["p5"].procs] == [LOST_EXIT_CODE] * 8
    assert sum(1 for _ in tmp_path.glob("state.*.journal")) == 1
