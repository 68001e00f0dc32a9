"""Finding clusters on this machine and telling live ones from stale ones.

A cluster is *running* when its ``cluster.json`` names a hub that is the same process
that wrote it (pid and start time match, so a reused pid is caught) and that answers
a signed request. Otherwise the file is *stale*: it is reported, never trusted.
"""

from __future__ import annotations

import json
import os
import signal
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .. import cluster_dir
from ..allocators import base as allocators
from ..errors import ClusterError
from ..protocol import hub_ops
from ..protocol.states import DiscoveryState
from ..wire import frames as wire_frames
from .hub_client import HubClient
from .launch import HUB_START_TIMEOUT_S

EPHEMERAL_PREFIX = "ephemeral-"
PROBE_TIMEOUT_S = 2.0  # how long a hub has to answer before it is called unresponsive


@dataclass
class Probe:
    """What is known about the cluster directory ``path``.

    ``state``: ``"running"`` (``hub_info`` holds the hub's answer), ``"starting"``
    (a client is starting its hub), ``"stale"`` (``reason`` says why), or ``"missing"``."""

    name: str
    path: Path
    state: DiscoveryState
    info: dict = field(default_factory=dict)  # cluster.json
    hub_info: dict = field(default_factory=dict)
    reason: str = ""


def probe(name: str) -> Probe:
    path = cluster_dir.cluster_path(name)
    try:
        info = cluster_dir.read_info(path)
    except FileNotFoundError:
        if not path.exists():
            return Probe(name, path, DiscoveryState.MISSING)
        if _young(path):
            return Probe(name, path, DiscoveryState.STARTING, reason="its hub is starting")
        return Probe(name, path, DiscoveryState.STALE, reason="cluster.json is missing")
    except (OSError, json.JSONDecodeError) as e:
        return Probe(name, path, DiscoveryState.STALE, reason=f"cluster.json is unreadable ({e})")
    if "hub" not in info:
        if _young(path):
            return Probe(name, path, DiscoveryState.STARTING, info, reason="its hub is starting")
        return Probe(name, path, DiscoveryState.STALE, info, reason="its hub never became ready (see hub.log)")
    problem = hub_process_problem(info)
    if problem:
        return Probe(name, path, DiscoveryState.STALE, info, reason=problem)
    wire_frames.register_key(info["cluster_id"], cluster_dir.key_of(info))
    try:
        hub_info = HubClient(info["cluster_id"], info["hub"]).request(hub_ops.INFO, timeout=PROBE_TIMEOUT_S)
    except ClusterError:
        alive = "is running but " if hub_alive(info) else ""
        return Probe(name, path, DiscoveryState.STALE, info,
                     reason=f"its hub (pid {info['hub_pid']}) {alive}does not answer "
                            f"at {info['hub']} within {PROBE_TIMEOUT_S:g} s")
    return Probe(name, path, DiscoveryState.RUNNING, info, hub_info)


def _young(path: Path) -> bool:
    """Created recently enough that a hub may still be starting there."""
    try:
        return time.time() - path.stat().st_ctime < HUB_START_TIMEOUT_S
    except FileNotFoundError:
        return False


def hub_process_problem(info: dict) -> str:
    """Why the hub named by ``info`` is not the live process that wrote it ("" if it is).
    Only checkable for a hub on this machine."""
    if info.get("hostname") != socket.gethostname():
        return ""
    pid = info["hub_pid"]
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return f"its hub (pid {pid}) is not running"
        if abs(proc.create_time() - info["hub_create_time"]) > 0.01:
            return f"its hub (pid {pid}) is gone; that pid now belongs to another process"
    except psutil.NoSuchProcess:
        return f"its hub (pid {pid}) is not running"
    return ""


def hub_alive(info: dict) -> bool:
    """Whether the hub named by ``info`` is the live process that wrote it, on this
    machine (it may still not answer: stopped, or too busy). Does not block."""
    return (bool(info.get("hub_pid")) and info.get("hostname") == socket.gethostname()
            and not hub_process_problem(info))


def end_hub(info: dict, wait_s: float = 0.0) -> None:
    """Make sure the hub named by ``info`` is gone, if it is still that process on this
    machine: wait up to ``wait_s`` seconds for it to exit, then SIGKILL it (so that a
    new hub never runs beside one that stopped answering)."""
    if "hub_pid" not in info or info.get("hostname") != socket.gethostname() or hub_process_problem(info):
        return
    try:
        proc = psutil.Process(info["hub_pid"])
        try:
            proc.wait(wait_s)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    except (psutil.NoSuchProcess, psutil.TimeoutExpired):
        pass


def stop_hub(info: dict, timeout: float = 10.0) -> None:
    """Stop the hub named by ``info`` if it is still that process on this machine: ask
    it (SIGTERM: one still starting stops the host agents it started; a starting client
    waiting on it gets its error), then kill it after ``timeout`` seconds."""
    if hub_alive(info):
        try:
            os.kill(info["hub_pid"], signal.SIGTERM)
        except ProcessLookupError:
            return
    end_hub(info, wait_s=timeout)


def wait_until_started(name: str) -> Probe:
    """Wait while another client starts the hub of ``name``; returns the final probe."""
    deadline = time.monotonic() + HUB_START_TIMEOUT_S
    found = probe(name)
    while found.state == DiscoveryState.STARTING and time.monotonic() < deadline:
        time.sleep(0.05)
        found = probe(name)
    return found


def names() -> list[str]:
    """Names of every cluster directory, sorted."""
    root = cluster_dir.clusters_root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def running_names() -> list[str]:
    """Retained clusters that are running (a script's ephemeral cluster is its own)."""
    found = [probe(n) for n in names()]
    return [p.name for p in found if p.state == DiscoveryState.RUNNING and not p.info.get("ephemeral")]


def is_ephemeral(found: Probe) -> bool:
    return bool(found.info.get("ephemeral")) or found.name.startswith(EPHEMERAL_PREFIX)


def leftover_agents(path: Path) -> list[psutil.Process]:
    """Host agents of the cluster at ``path`` still running on this machine: those the
    state file names and any other ``monarch_nb.host`` process whose command line names
    ``path`` (so a damaged state file hides none)."""
    pids = set()
    try:
        with open(path / "state.json") as f:
            state = json.load(f)
        pids = {h["pid"] for h in state.get("hosts", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    agents = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            named = proc.info["pid"] in pids or "monarch_nb.host" in cmdline
            if named and str(path) in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
                agents.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return agents


def _signal_all(processes: list[psutil.Process], sig: int) -> None:
    """Send ``sig`` to each of ``processes``; one that has exited already is skipped."""
    for process in processes:
        try:
            process.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def remove_stale(path: Path, timeout: float = 5.0) -> None:
    """Stop what is left of a cluster whose hub is gone, still starting or not
    answering (:func:`stop_hub`; host agents take their procs with them) and delete
    its directory."""
    try:
        stop_hub(cluster_dir.read_info(path), timeout)
    except (OSError, ValueError):
        pass
    agents = leftover_agents(path)
    _signal_all(agents, signal.SIGTERM)  # (an agent may end on its own meanwhile: the hub is gone)
    _, alive = psutil.wait_procs(agents, timeout=timeout)
    _signal_all(alive, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=timeout)
    try:  # an allocation elsewhere (a Slurm job) ends too
        with open(path / "state.json") as f:
            saved = json.load(f)
        if isinstance(saved, dict):
            allocators.release_leftovers(str(path), saved.get("allocator"))
            for added in (saved.get("allocations") or {}).values():
                allocators.release_leftovers(str(path), added.get("spec"))
    except (OSError, ValueError):  # no state, or a damaged one: nothing known to release
        pass
    if path.parent == cluster_dir.clusters_root() and os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
