"""A cluster whose start is given up leaves nothing running: `monarch-nb cluster stop`
on a cluster still starting stops its hub and the host agents it started, and a hub
whose starting client went away (Ctrl-C, a `timeout`, a kill) stops by itself.

The hosts here never report (each "host agent" is a `sleep`, started through the
command allocator), so the cluster stays starting for as long as a test needs."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import psutil

from conftest import pids_alive, wait_until
from monarch_nb import cluster_dir

HOSTS = 3
BOUND_S = 60.0
_names = itertools.count()

STARTER = f"""
import sys
from monarch_nb.allocators.command import CommandAllocator
from monarch_nb.client.cluster import Cluster

never_reports = ["sh", "-c", "exec sleep 600", "--"]
try:
    Cluster.start(sys.argv[1], allocator=CommandAllocator([never_reports] * {HOSTS}, bind="127.0.0.1"))
except Exception as e:
    print("start failed:", e, flush=True)
    sys.exit(3)
"""


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monarch_nb.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200"})


def _start_hanging() -> tuple[str, subprocess.Popen, int, list[int]]:
    """Start a cluster whose hosts never report; returns its name, the starting client,
    the hub's pid and its host agents' pids, once all of them run."""
    name = f"abandoned-{os.getpid()}-{next(_names)}"
    starter = subprocess.Popen([sys.executable, "-c", STARTER, name], stdout=subprocess.PIPE, text=True)
    path = cluster_dir.cluster_path(name)

    def hub_pid() -> int | None:
        try:
            return cluster_dir.read_info(path).get("hub_pid")
        except (OSError, ValueError):
            return None

    assert wait_until(lambda: hub_pid() is not None, BOUND_S), "the hub never said who it is"
    hub = psutil.Process(hub_pid())
    assert wait_until(lambda: len(hub.children()) == HOSTS, BOUND_S), hub.children()
    return name, starter, hub.pid, [p.pid for p in hub.children()]


def test_stopping_a_cluster_that_is_still_starting_ends_its_hub_and_agents_and_the_start():
    # `cluster stop` said "stopped" and removed the directory while the hub went on
    # starting host agents, for as long as it took (1,000 of them: minutes), unreachable.
    name, starter, hub, agents = _start_hanging()
    try:
        stopped = _cli("cluster", "stop", name)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert wait_until(lambda: not pids_alive([hub, *agents]), BOUND_S), pids_alive([hub, *agents])
        out, _ = starter.communicate(timeout=BOUND_S)
        assert starter.returncode == 3 and "could not start" in out, out
        assert not cluster_dir.cluster_path(name).exists()
    finally:
        starter.kill()
        starter.wait()


def test_a_hub_whose_starting_client_went_away_stops_what_it_started():
    # A `timeout 60 monarch-nb cluster start ...` killed while hosts came up left a hub
    # that went on starting them and then ran with no one to use it.
    name, starter, hub, agents = _start_hanging()
    try:
        starter.kill()
        starter.wait()
        assert wait_until(lambda: not pids_alive([hub, *agents]), BOUND_S), pids_alive([hub, *agents])
        log = (cluster_dir.cluster_path(name) / "hub.log").read_text(errors="replace")
        assert "the client that started this cluster went away" in log, log
    finally:
        assert _cli("cluster", "stop", name).returncode == 0  # its directory is left, stale, for `stop`
