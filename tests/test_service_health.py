"""Services in the cluster's health tree and supervision: the hub knows which proc meshes
are a service's replicas, the routing client adds their load, and replica deaths the
service replaces are not reported as unhandled failures. One module ephemeral cluster."""

from __future__ import annotations

import os
import signal

import pytest

from monarch_nb import health_view
from monarch_nb.actor import Actor, endpoint
from monarch_nb.client.runtime import runtime
from monarch_nb.errors import MeshFailure
from monarch_nb.protocol import services as records
from monarch_nb.service import ReplicaState, connect_service, services
from conftest import pids_alive, wait_until

BOUND_S = 60


class Echo(Actor):
    def __init__(self, tag: str = ""):
        self.tag = tag

    @endpoint
    def echo(self, x):
        return (os.getpid(), self.tag, x)


@pytest.fixture
def service(host):
    made = []

    def make(num_replicas: int = 2, **options):
        svc = Echo.options(procs=1, num_replicas=num_replicas, hosts=host, **options).as_service("t")
        made.append(svc)
        return svc.wait_ready(BOUND_S)

    yield make
    for svc in made:
        pids = [p for r in svc.replicas for p in (r.procs.pids if r.procs is not None else [])]
        svc.shutdown()
        assert wait_until(lambda: not pids_alive(pids), 10), f"replica procs left: {pids_alive(pids)}"


def test_grouping_keeps_each_replicas_newest_proc_mesh_and_tells_same_named_services_apart():
    def mesh(key, idx, gen, name="svc"):
        return {records.SERVICE: {records.NAME: name, records.KEY: key, records.REPLICA: idx,
                                  records.GENERATION: gen, records.REPLICAS: 2}}

    found = records.group({"a-r0g1": mesh("a", 0, 1), "a-r0g2": mesh("a", 0, 2), "a-r1g1": mesh("a", 1, 1),
                           "plain": {"name": "plain"}})
    assert list(found) == ["svc"]
    assert found["svc"]["replica_meshes"] == {0: "a-r0g2", 1: "a-r1g1"}
    assert found["svc"]["replica_generations"] == {0: 2, 1: 1}
    two = records.group({"a-r0g1": mesh("a", 0, 1), "b-r0g1": mesh("b", 0, 1)})
    assert sorted(two) == ["a", "b"]  # one name, two services: keyed by their keys


def test_an_adopted_service_keeps_its_restart_window_and_one_recorded_before_windows_gets_the_default():
    from monarch_nb.service.adopt import restart_budget_of
    from monarch_nb.service.defaults import RESTART_WINDOW_S

    assert restart_budget_of({records.MAX_RESTARTS: 2, records.RESTART_WINDOW_S: 5.0}) == (2, 5.0)
    assert restart_budget_of({records.MAX_RESTARTS: 2, records.RESTART_WINDOW_S: None}) == (2, None)
    assert restart_budget_of({records.MAX_RESTARTS: 2}) == (2, RESTART_WINDOW_S)


def test_a_recovered_hub_knows_which_proc_meshes_are_replicas(tmp_path):
    from monarch_nb.hub import state
    from monarch_nb.hub.records import ProcMeshRecord, ProcRecord

    record = {records.NAME: "svc", records.KEY: "svc-abc123", records.REPLICA: 0, records.GENERATION: 2}
    meshes = {"svc-abc123-r0g2": ProcMeshRecord("svc-abc123-r0g2", {"procs": 1},
                                                [ProcRecord("svc-abc123-r0g2/0", "h0", "tcp://x", 1)], service=record),
              "plain": ProcMeshRecord("plain", {"procs": 1}, [ProcRecord("plain/0", "h0", "tcp://y", 2)])}
    state.write_snapshot(tmp_path, state.snapshot(0.0, {}, [], 2, meshes, {}, None, 0))
    loaded = state.load(tmp_path)["proc_meshes"]
    assert loaded["svc-abc123-r0g2"].service == record and loaded["plain"].service is None


def test_the_hub_gives_each_replica_the_state_of_its_worst_proc_and_says_when_it_has_none():
    from monarch_nb.hub.health import service_nodes
    from monarch_nb.hub.records import ProcMeshRecord, ProcRecord

    def replica(idx, pid, exit_code=None):
        name = f"svc-k-r{idx}g1"
        record = {records.NAME: "svc", records.KEY: "svc-k", records.CLASS: "m.Policy", records.REPLICA: idx,
                  records.GENERATION: 1, records.REPLICAS: 3}
        return name, ProcMeshRecord(name, {"procs": 1}, [ProcRecord(f"{name}/0", "h0", "tcp://x", pid, exit_code)],
                                    service=record)

    meshes = dict([replica(0, 10), replica(1, 11, exit_code=-9)])  # replica 2 has no procs now
    [node] = service_nodes(meshes, {"svc-k-r0g1/0": "busy"})
    assert (node["name"], node["key"], node["class"]) == ("svc", "svc-k", "m.Policy")
    states = [(r["replica"], r["state"], r["pids"]) for r in node["replicas"]]
    assert states == [(0, "busy", [10]), (1, "failed", [11]), (2, "stopped", [])]
    assert "SIGKILL" in node["replicas"][1]["cause"] and "no procs now" in node["replicas"][2]["cause"]
    assert health_view.service_node(node).state == "degraded"


def test_the_health_tree_shows_a_services_replicas_with_this_clients_load(cluster, service):
    svc = service(2, name="echoes")
    for i in range(6):
        svc.echo.route(i).get(timeout=BOUND_S)
    tree = cluster.health()
    [node] = [s for s in tree["services"] if s["name"] == "echoes"]
    assert node["class"].endswith("Echo") and node["routed_here"]
    replicas = node["replicas"]
    assert [r["replica"] for r in replicas] == [0, 1]
    assert [r["pids"] for r in replicas] == [r.procs.pids for r in svc.replicas]
    assert {r["state"] for r in replicas} == {"healthy"} and {r["service_state"] for r in replicas} == {"healthy"}
    assert sum(r["requests"] for r in replicas) == 6 and all(r["in_flight"] == 0 for r in replicas)
    text = health_view.to_plain(tree)
    assert "services (1)" in text and "echoes  Echo · 2/2 replicas serving" in text
    assert "replica 1  healthy · on echoes-" in text and "3 requests · 0 in flight" in text
    table = health_view.service_text(node)
    assert table.splitlines()[1].split() == ["replica", "state", "requests", "in", "flight", "p50", "ms", "p99",
                                             "ms", "restarts", "procs"]
    assert table.splitlines()[2].split()[:4] == ["0", "healthy", "3", "0"]
    assert 'data-mnb-node="service:echoes/1"' in health_view.to_html(tree)


def test_cluster_services_gives_this_clients_own_handle(cluster, service):
    svc = service(1, name="mine")
    assert cluster.services["mine"] is svc
    assert connect_service("mine", cluster) is svc and services(cluster)["mine"] is svc
    with pytest.raises(KeyError, match="no service 'nope'.*mine"):
        connect_service("nope", cluster)


def test_a_replica_death_the_service_replaces_reaches_no_failure_hook(service, faults):
    svc = service(2, name="quiet")
    heard: list[MeshFailure] = []
    rt = runtime()
    rt.set_failure_hook(lambda cluster_id, failure, owner: heard.append(failure))
    try:
        victim = svc.replicas[0]
        old, mesh = victim.procs.pids[0], victim.actors.name
        os.kill(old, signal.SIGKILL)
        assert rt.supervision.wait_heard(svc._cluster_id, mesh, BOUND_S)  # the failure went by the hooks
        assert wait_until(lambda: victim.restarts == 1 and victim.state is ReplicaState.HEALTHY, BOUND_S)
        assert svc.echo.fanout(1).get(timeout=BOUND_S)[0][0] != old
    finally:
        rt.set_failure_hook(None)
    assert [f for f in heard if any(m.startswith(svc._key) for m in f.meshes)] == []
    assert faults == []


def test_supervision_leaves_a_meshs_failures_to_its_owner_only_while_marked():
    supervision = runtime().supervision
    failure = MeshFailure("proc_failed", ("m",), (0,), "m rank 0: killed", "m", 0)
    assert supervision.handled_by("c", failure) is None
    supervision.mark_handled("c", ["m"], "service 's'")
    try:
        assert supervision.handled_by("c", failure) == "service 's'"
        assert supervision.handled_by("other-cluster", failure) is None
        both = MeshFailure("proc_failed", ("m", "n"), (0,), "why")
        assert supervision.handled_by("c", both) is None  # n is nobody's: the hook hears of it
    finally:
        supervision.mark_handled("c", ["m"], None)
    assert supervision.handled_by("c", failure) is None
