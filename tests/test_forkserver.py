"""Procs are forked by their host's forkserver (``monarch_nb.host.forkserver``), and a
forked proc is what a freshly started ``python -m monarch_nb.proc`` would be: its own
pid, random state, environment, working directory, output in the logs; a proc whose
``PYTHONPATH`` would import another copy of a preloaded module is started fresh; a
forkserver that dies takes its procs with it (they fail as any dead proc) and the next
spawn starts fresh interpreters."""

from __future__ import annotations

import gc
import os
import random
import signal
import sys

import psutil
import pytest
from conftest import cluster_processes, pids_alive, wait_until

from monarch_nb.actor import Actor, SupervisionError, endpoint
from monarch_nb.client.cluster import Cluster

BOUND_S = 60.0


class Probe(Actor):
    @endpoint
    def facts(self) -> dict:
        import numpy

        parent = psutil.Process(os.getppid())
        print(f"probe says hello from {os.getpid()}", flush=True)
        return {"pid": os.getpid(), "parent_cmdline": parent.cmdline(), "cmdline": psutil.Process().cmdline(),
                "cwd": os.getcwd(),
                "random": random.random(), "numpy": float(numpy.random.random()),
                "argv0": sys.argv[0], "env": os.environ.get("FORKSERVER_TEST"),
                "rank_env": os.environ.get("RANK")}

    @endpoint
    def probe_value(self) -> str:
        import preload_probe

        return preload_probe.VALUE

    @endpoint
    def collector(self) -> dict:
        gc.collect()
        return {"pid": os.getpid(), "enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
                "walked": len(gc.get_objects())}


def _is_forkserver(cmdline: list[str]) -> bool:
    return "monarch_nb.host.forkserver" in cmdline


# A preloaded module: VALUE, and a reference cycle whose __del__ leaves a mark named
# for the proc that finalizes it (PRELOAD_MARKS: the folder).
PRELOAD_PROBE = """
import os
VALUE = "agent's"


class _Cycle:
    def __init__(self):
        self.me = self
        self.os = os  # (the module's globals are None by the time a finalizer runs)

    def __del__(self):
        folder = self.os.environ.get("PRELOAD_MARKS")
        if folder:
            with open(self.os.path.join(folder, f"del-{self.os.getpid()}"), "w") as f:
                f.write("finalized")


held = _Cycle()
"""


@pytest.fixture
def preloading_cluster(tmp_path, monkeypatch):
    """A cluster whose forkserver preloads numpy and ``preload_probe`` (PRELOAD_PROBE, from
    a folder on the agents' PYTHONPATH and the client's path), so its procs are forked."""
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "preload_probe.py").write_text(PRELOAD_PROBE)
    monkeypatch.setenv("PYTHONPATH", str(agents))
    monkeypatch.syspath_prepend(str(agents))  # the procs' path (the client's) finds the same copy: forked
    monkeypatch.setenv("PRELOAD_MARKS", str(tmp_path / "marks"))
    monkeypatch.setenv("MONARCH_NB_PROC_PRELOAD", "numpy,preload_probe")
    monkeypatch.setenv("FORKSERVER_TEST", "inherited")
    c = Cluster.start_ephemeral()
    yield c
    c.stop()
    assert wait_until(lambda: not cluster_processes(c.path), 10), f"left behind: {cluster_processes(c.path)}"


def test_a_forked_proc_is_what_a_started_one_would_be(preloading_cluster, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    procs = preloading_cluster.this_host().spawn_procs(per_host={"gpus": 3})
    facts = [f for _, f in procs.spawn("probe", Probe).facts.call().get(timeout=BOUND_S)]
    assert all(_is_forkserver(f["parent_cmdline"]) for f in facts), facts  # forked, not started
    assert all(_is_forkserver(f["cmdline"]) for f in facts), facts  # and not exec'd afresh in the child
    assert len({f["pid"] for f in facts}) == 3
    assert len({f["random"] for f in facts}) == 3, "each proc has its own random state"
    assert len({f["numpy"] for f in facts}) == 3, "numpy preloaded: each proc reseeded"
    assert {f["cwd"] for f in facts} == {str(tmp_path)}  # the client's working directory, as before
    assert {f["env"] for f in facts} == {"inherited"}
    assert all(f["argv0"].endswith(os.path.join("monarch_nb", "proc", "__main__.py")) for f in facts)
    assert wait_until(lambda: len(preloading_cluster.logs(mesh="probe", grep="probe says hello")) == 3, BOUND_S), \
        "each forked proc's stdout reaches the cluster's logs"


def test_a_forked_procs_collections_skip_the_preload_and_its_stop_still_finalizes_it(preloading_cluster,
                                                                                      tmp_path):
    # Each full collection of a proc walked every object the forkserver had imported
    # (with torch, ~0.1 s of CPU in every gc.collect() of every rank) and copied the
    # pages they shared with the proc's siblings.
    (tmp_path / "marks").mkdir()
    procs = preloading_cluster.this_host().spawn_procs(per_host={"gpus": 2})
    states = [s for _, s in procs.spawn("probe", Probe).collector.call().get(timeout=BOUND_S)]
    for state in states:
        assert state["enabled"], state
        assert state["frozen"] > 10_000, state  # monarch_nb, numpy, preload_probe
        assert state["walked"] < state["frozen"], state
    procs.stop().get(timeout=BOUND_S)
    # The preloaded module's cycle is still finalized when its proc stops.
    assert {p.name for p in (tmp_path / "marks").iterdir()} == {f"del-{s['pid']}" for s in states}


def test_a_proc_whose_path_imports_another_copy_is_started_fresh(preloading_cluster, tmp_path, monkeypatch):
    client = tmp_path / "client"
    client.mkdir()
    (client / "preload_probe.py").write_text("VALUE = \"client's\"\n")
    monkeypatch.syspath_prepend(str(client))  # procs get the client's sys.path as PYTHONPATH
    procs = preloading_cluster.this_host().spawn_procs(per_host={"gpus": 2})
    probes = procs.spawn("probe", Probe)
    assert set(probes.probe_value.call().get(timeout=BOUND_S).values()) == {"client's"}
    parents = [f["parent_cmdline"] for _, f in probes.facts.call().get(timeout=BOUND_S)]
    assert all(_is_forkserver(p) for p in parents)  # forked, then exec'd in place: the same child


def test_a_dead_forkserver_fails_its_procs_and_spawning_goes_on(cluster, faults):
    host = cluster.this_host()
    procs = host.spawn_procs(per_host={"gpus": 2})
    probes = procs.spawn("probe", Probe)
    parent = psutil.Process(probes.facts.call().get(timeout=BOUND_S).values()[0]["pid"]).parent()
    assert _is_forkserver(parent.cmdline())
    pids = procs.pids
    parent.kill()
    # kill() only sends the signal: a call made at once may still be answered.
    assert wait_until(lambda: not pids_alive(pids), BOUND_S), "its procs died with it"
    with pytest.raises(SupervisionError):
        probes.facts.call().get(timeout=BOUND_S)
    again = host.spawn_procs(per_host={"gpus": 2})
    facts = [f for _, f in again.spawn("probe", Probe).facts.call().get(timeout=BOUND_S)]
    assert not any(_is_forkserver(f["parent_cmdline"]) for f in facts)  # started fresh by the agent
    again.stop().get(timeout=BOUND_S)
    assert pids_alive([parent.pid]) == []


def test_an_agent_killed_takes_its_forkserver_and_procs_along(tmp_path):
    c = Cluster.start_ephemeral()
    try:
        procs = c.this_host().spawn_procs(per_host={"gpus": 2})
        facts = procs.spawn("probe", Probe).facts.call().get(timeout=BOUND_S).values()
        forkserver = psutil.Process(facts[0]["pid"]).parent()
        agent = forkserver.parent()
        everyone = [forkserver.pid, *procs.pids]
        os.kill(agent.pid, signal.SIGKILL)
        assert wait_until(lambda: not pids_alive(everyone), BOUND_S), pids_alive(everyone)
    finally:
        c.stop()
    assert wait_until(lambda: not cluster_processes(c.path), 10), f"left behind: {cluster_processes(c.path)}"
