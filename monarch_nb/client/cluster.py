"""A cluster as seen from a client: starting its hub, its host mesh, stopping it.

A script's first ``this_host()`` starts an *ephemeral* cluster: a hub (child of this
process, which dies with it), one local host agent and no procs yet. It is stopped
at interpreter exit, and if this process dies any other way the hub notices at once
(``PR_SET_PDEATHSIG`` plus a parent watchdog) and stops every host agent and proc.
"""

from __future__ import annotations

import atexit
import os
import secrets
import select
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from .. import cluster_dir
from ..errors import ClusterError
from ..wire import frames as wire_frames
from .host_mesh import HostMesh
from .hub_client import HubClient

HUB_START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


class Cluster:
    """A running cluster: ``host_mesh()``, ``info()``, ``stop()``."""

    def __init__(self, name: str, path: Path, info: dict, hub_process: subprocess.Popen | None = None):
        self.name = name
        self.path = path
        self._info = info
        self._hub_process = hub_process
        wire_frames.register_key(info["cluster_id"], cluster_dir.key_of(info))
        self.hub = HubClient(info["cluster_id"], info["hub"])
        self._stopped = False

    @classmethod
    def start_ephemeral(cls, hosts: int = 1, grace_s: float = 2.0) -> "Cluster":
        """Start a cluster that lives and dies with this process; returns once its hub and
        ``hosts`` host agents are up. Raises :class:`ClusterError` if they don't come up
        within ``HUB_START_TIMEOUT_S`` seconds."""
        name = f"ephemeral-{os.getpid()}-{secrets.token_hex(3)}"
        path, info = cluster_dir.create(name)
        read_fd, write_fd = os.pipe()
        try:
            hub = subprocess.Popen(
                [sys.executable, "-m", "monarch_nb.hub", "--cluster-dir", str(path), "--hosts", str(hosts),
                 "--ephemeral-parent", str(os.getpid()), "--grace", str(grace_s), "--ready-fd", str(write_fd)],
                pass_fds=(write_fd,), stdin=subprocess.DEVNULL)
        finally:
            os.close(write_fd)
        try:
            ready, _, _ = select.select([read_fd], [], [], HUB_START_TIMEOUT_S)
            line = os.read(read_fd, 64) if ready else b""
        finally:
            os.close(read_fd)
        if line.strip() != b"ready":
            hub.kill()
            hub.wait()
            shutil.rmtree(path, ignore_errors=True)
            raise ClusterError(f"the hub of cluster {name} did not start within {HUB_START_TIMEOUT_S} s "
                               f"(exit code {hub.poll()}); see its stderr above")
        cluster = cls(name, path, cluster_dir.read_info(path), hub)
        atexit.register(cluster.stop)
        return cluster

    def info(self) -> dict:
        """Hosts, proc meshes and actor meshes as the hub knows them."""
        return self.hub.request("info", timeout=30.0)

    def host_mesh(self) -> HostMesh:
        """The cluster's hosts, extent ``{"hosts": N}``."""
        info = self.info()
        return HostMesh(self._info["cluster_id"], self._info["hub"], [h["host_id"] for h in info["hosts"]])

    def stop(self) -> None:
        """Stop every proc, host agent and the hub; blocks until they have exited
        (killing what is left after ``STOP_TIMEOUT_S`` seconds). Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        hub_gone = self._hub_process is not None and self._hub_process.poll() is not None
        if not hub_gone:
            try:
                self.hub.request("shutdown", timeout=STOP_TIMEOUT_S)
            except Exception:  # the hub is gone or stuck: the wait/kill below handles it
                pass
        if self._hub_process is not None:
            try:
                self._hub_process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._hub_process.kill()
                self._hub_process.wait()
        global _default
        if _default is self:
            _default = None

    def __repr__(self) -> str:
        return f"<Cluster {self.name!r}>"


_default: Cluster | None = None
_default_lock = threading.Lock()


def default_cluster() -> Cluster:
    """The cluster ``this_host()`` refers to, started (ephemeral) on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Cluster.start_ephemeral()
        return _default


def this_host() -> HostMesh:
    """The host mesh of the current cluster, extent ``{"hosts": 1}`` for a local one.

    In a script (no cluster connected yet) this starts an ephemeral local cluster that
    is torn down when the script exits. Blocks until the cluster is up (~0.2 s)."""
    return default_cluster().host_mesh()
