"""Local allocator: every "host" is a host agent process on this machine."""

from __future__ import annotations

import subprocess
import sys
import time


class LocalAllocator:
    """Starts host agents as children of the hub.

    ``grace_s`` is how long an agent keeps its procs after the hub falls silent.
    """

    def __init__(self, cluster_dir: str, grace_s: float):
        self.cluster_dir = cluster_dir
        self.grace_s = grace_s
        self.agents: dict[str, subprocess.Popen] = {}

    def start(self, hub_address: str, hosts: int) -> list[str]:
        """Start ``hosts`` host agents; returns their host ids (they report in to the hub)."""
        ids = []
        for i in range(len(self.agents), len(self.agents) + hosts):
            host_id = f"host{i}"
            self.agents[host_id] = subprocess.Popen(
                [sys.executable, "-m", "monarch_nb.host", "--cluster-dir", self.cluster_dir,
                 "--hub", hub_address, "--host-id", host_id, "--grace", str(self.grace_s)],
                stdin=subprocess.DEVNULL)
            ids.append(host_id)
        return ids

    def stop(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for agents told to shut down, then kill the rest."""
        deadline = time.monotonic() + timeout
        for agent in self.agents.values():
            try:
                agent.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
        self.agents.clear()
