"""Local allocator: every "host" is a host agent process on this machine."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading

import psutil

from ..protocol.records import exit_cause


class LocalAllocator:
    """Starts host agents as children of the hub, or adopts those a previous hub of the
    cluster started (see :mod:`.base` for the protocol).

    ``grace_s`` is how long an agent keeps its procs after the hub falls silent.
    ``allocation``: the name of an allocation added to a running cluster (its host ids
    are ``{allocation}-host{i}``), ``""`` for the cluster's own.
    """

    kind = "local"
    start_timeout_s = 60.0
    # check() is a waitpid per agent: asked this often, a host whose agent exits is
    # failed within a fifth of a second, not the hub's usual poll of a second.
    check_every_s = 0.2

    def __init__(self, cluster_dir: str, grace_s: float, allocation: str = ""):
        self.cluster_dir = cluster_dir
        self.grace_s = grace_s
        self.host_prefix = f"{allocation}-" if allocation else ""
        self.agents: dict[str, subprocess.Popen | psutil.Process] = {}
        self.host_ids: list[str] = []
        self._ids = itertools.count()
        self._cancelled = threading.Event()  # the hub gave the start up (cancel_start)

    def spec(self) -> dict:
        return {"kind": self.kind}

    def bind_address(self) -> str | None:
        return None

    def start(self, hub_address: str, hosts: int) -> list[str]:
        """Start ``hosts`` host agents; returns their host ids (they report in to the hub)."""
        ids = []
        for i in range(hosts):
            if self._cancelled.is_set():
                break
            host_id = self._next_id()
            self.agents[host_id] = subprocess.Popen(
                [*self._prefix(i), sys.executable, "-m", "monarch_nb.host", "--cluster-dir", self.cluster_dir,
                 "--hub", hub_address, "--host-id", host_id, "--grace", str(self.grace_s), *self._agent_args()],
                stdin=subprocess.DEVNULL)
            ids.append(host_id)
        self.host_ids += ids
        return ids

    def cancel_start(self) -> None:
        self._cancelled.set()

    def _prefix(self, index: int) -> list[str]:
        """What the ``index``-th agent's command line starts with (nothing: run it here)."""
        return []

    def _agent_args(self) -> list[str]:
        return []

    def check(self) -> dict[str, str]:
        """Agents that have exited: within a poll (``check_every_s``) instead of the
        hub's 3 s heartbeat timeout, which still covers agents this hub cannot watch."""
        ended = {}
        for host_id, agent in self.agents.items():
            if isinstance(agent, subprocess.Popen):
                code = agent.poll()
                if code is not None:
                    ended[host_id] = f"its host agent (pid {agent.pid}) {exit_cause(code)}"
            elif not _running(agent):
                ended[host_id] = f"its host agent (pid {agent.pid}) exited"
        return ended

    def waiting_for(self) -> str:
        exited = [f"{h} (exit code {a.returncode})" for h, a in self.agents.items()
                  if isinstance(a, subprocess.Popen) and a.poll() is not None]
        return f"host agents that exited: {', '.join(exited)}" if exited else ""

    def adopt(self, pids: dict[str, int]) -> None:
        """Take charge of running host agents (host id -> pid) started by an earlier hub."""
        for host_id, pid in pids.items():
            if host_id not in self.host_ids:
                self.host_ids.append(host_id)
            try:
                self.agents[host_id] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                pass

    def stop(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for agents told to shut down, then kill the rest."""
        procs = []
        for agent in self.agents.values():
            try:
                procs.append(agent if isinstance(agent, psutil.Process) else psutil.Process(agent.pid))
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=timeout)
        for p in alive:
            p.kill()
        psutil.wait_procs(alive, timeout=timeout)
        for agent in self.agents.values():
            if isinstance(agent, subprocess.Popen):
                agent.wait()  # reap our own children
        self.agents.clear()

    def _next_id(self) -> str:
        while True:  # skipping ids of adopted agents
            host_id = f"{self.host_prefix}host{next(self._ids)}"
            if host_id not in self.agents:
                return host_id


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class LocalHosts:
    """``hosts`` host agents on this machine, as an allocator given to
    ``Cluster.allocate`` or ``ReplicaGroups(allocator=...)`` (each group then has local
    agents of its own: on one machine, how a Slurm job per group is tried out). Raises
    ``ValueError`` for ``hosts`` below 1."""

    kind = "local"
    start_timeout_s = LocalAllocator.start_timeout_s

    def __init__(self, hosts: int = 1):
        if not isinstance(hosts, int) or isinstance(hosts, bool) or hosts < 1:
            raise ValueError(f"LocalHosts(hosts={hosts!r}): give 1 or more")
        self.hosts = hosts

    def spec(self) -> dict:
        return {"kind": self.kind}

    def __repr__(self) -> str:
        return f"LocalHosts(hosts={self.hosts})"
