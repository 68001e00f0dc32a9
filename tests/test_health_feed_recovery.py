"""The health feed across a hub restart: a retained cluster's hub killed and recovered
(``Cluster.recover``) keeps no subscription of the old one; a HealthWatch subscribes to
the new hub as soon as its cluster finds it, and shows what happens there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

import monarch_nb
from monarch_nb import cluster_dir
from monarch_nb.client import health_watch
from monarch_nb.client.health_watch import HealthWatch
from monarch_nb.client.runtime import runtime

from conftest import cluster_processes, wait_until


@pytest.fixture
def retained():
    """A retained cluster (grace 30 s: its procs wait for a recovered hub); stopped and
    checked gone afterwards."""
    name = f"feedrecover{os.getpid()}"
    cluster = monarch_nb.Cluster.start(name, grace_s=30)
    yield cluster
    path = cluster_dir.cluster_path(name)
    subprocess.run([sys.executable, "-m", "monarch_nb.cli", "cluster", "stop", name], capture_output=True)
    assert wait_until(lambda: not cluster_processes(path), 15), cluster_processes(path)
    assert not path.exists(), f"{path} left behind"
    if runtime().cluster is not None:
        runtime().cluster.disconnect()
        runtime().cluster = None


class _Trees:
    """The trees a feed delivered (its ``on_tree``), read from the test's thread."""

    def __init__(self):
        self._trees: list[dict] = []
        self._lock = threading.Lock()

    def __call__(self, tree: dict) -> None:
        with self._lock:
            self._trees.append(tree)

    def state(self, mesh: str, rank: int) -> str | None:
        with self._lock:
            if not self._trees:
                return None
            tree = self._trees[-1]
        procs = [p for h in tree["hosts"] for p in h["procs"] if p["proc_mesh"] == mesh and p["rank"] == rank]
        return procs[0]["state"] if procs else None


def test_a_feed_resubscribes_to_a_recovered_hub_and_shows_a_proc_death_there(retained, monkeypatch):
    # Silence never makes this feed subscribe again: only learning of the new hub can.
    monkeypatch.setattr(health_watch, "SILENT_S", float("inf"))
    procs = retained.host_mesh().spawn_procs(per_host={"gpus": 2}, name="fed")
    trees, ended = _Trees(), []
    watch = HealthWatch(retained, trees, ended.append, tick_s=3600.0)
    try:
        assert wait_until(lambda: trees.state("fed", 1) == "healthy", 15)
        os.kill(retained._info["hub_pid"], signal.SIGKILL)
        monarch_nb.Cluster.recover(retained.name)
        assert wait_until(lambda: watch.subscriptions == 2, 15), "the feed did not subscribe to the new hub"
        os.kill(procs.pids[1], signal.SIGKILL)
        assert wait_until(lambda: trees.state("fed", 1) == "failed", 15)
        assert trees.state("fed", 0) == "healthy"
        assert watch.subscriptions == 2 and not ended
    finally:
        watch.stop(5)
    assert not watch.running


def test_a_feed_that_meets_a_dead_hub_waits_for_the_recovered_one_instead_of_ending(retained, monkeypatch):
    # Silence after 1 s: the feed tries to subscribe again while the hub is dead.
    monkeypatch.setattr(health_watch, "SILENT_S", 1.0)
    procs = retained.host_mesh().spawn_procs(per_host={"gpus": 2}, name="waits")
    trees, ended = _Trees(), []
    watch = HealthWatch(retained, trees, ended.append, tick_s=3600.0)
    try:
        assert wait_until(lambda: trees.state("waits", 1) == "healthy", 15)
        os.kill(retained._info["hub_pid"], signal.SIGKILL)
        assert wait_until(lambda: watch.hub_down, 15), "the feed never met the dead hub"
        assert watch.running and not ended  # it met the dead hub, and waits
        monarch_nb.Cluster.recover(retained.name)
        os.kill(procs.pids[0], signal.SIGKILL)
        assert wait_until(lambda: trees.state("waits", 0) == "failed", 15)
        assert not watch.hub_down and not ended
    finally:
        watch.stop(5)
    assert not watch.running


def test_the_widget_marks_its_tree_stale_while_the_hub_is_down_and_live_once_recovered(retained, monkeypatch):
    # Silence never makes this feed subscribe again: only the cluster's own check of its
    # hub can tell it. The widget went on showing the last tree (all healthy), unmarked,
    # while the hub was dead.
    from monarch_nb.notebook.health_widget import HealthWidget

    monkeypatch.setattr(health_watch, "SILENT_S", float("inf"))
    retained.host_mesh().spawn_procs(per_host={"gpus": 1}, name="stale")
    widget = HealthWidget(retained, tick_s=3600.0)
    try:
        assert wait_until(lambda: widget.state_of("proc:stale/0") == "healthy", 15)
        os.kill(retained._info["hub_pid"], signal.SIGKILL)
        assert wait_until(lambda: "is down" in widget._summary.value, 10), "the widget never said it was not live"
        assert f"monarch-nb cluster recover {retained.name}" in widget._summary.value
        assert widget._watch.hub_down and widget.ended is None
        assert widget.state_of("proc:stale/0") == "healthy"  # the last tree, kept
        shown = widget.refreshes
        monarch_nb.Cluster.recover(retained.name)
        assert wait_until(lambda: widget.refreshes > shown, 15), "no tree from the recovered hub"
        assert "is down" not in widget._summary.value and widget.ended is None
        assert widget.state_of("proc:stale/0") == "healthy"
    finally:
        widget.close()
    assert not widget._watch.running


def test_a_feed_ends_at_once_when_another_client_stops_the_cluster(retained):
    # It showed the last tree ("2/2 procs healthy") for the whole grace period (30 s
    # here) and then ended saying the hub died and was not recovered.
    retained.host_mesh().spawn_procs(per_host={"gpus": 2}, name="ends")
    trees, ended = _Trees(), []
    watch = HealthWatch(retained, trees, ended.append, tick_s=3600.0)
    try:
        assert wait_until(lambda: trees.state("ends", 1) == "healthy", 15)
        stopped = subprocess.run([sys.executable, "-m", "monarch_nb.cli", "cluster", "stop", retained.name],
                                 capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert wait_until(lambda: ended, 10), "the feed went on showing a stopped cluster"
        assert ended == ["cluster stopped"]
    finally:
        watch.stop(5)
    assert not watch.running
