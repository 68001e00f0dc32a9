"""``HostMesh``: the hosts of a cluster; spawns proc meshes on them."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Mapping

from ..mesh import Extent, Shape
from ..proc.actor import owner_of_new_meshes
from ..protocol import hub_ops
from . import progress
from .future import Future
from .mesh_handle import MeshHandle
from .proc_mesh import ProcMesh
from .runtime import runtime

SPAWN_TIMEOUT_S = 120.0


def _proc_env() -> dict[str, str]:
    """Let procs import what this client imports (its ``sys.path``)."""
    paths = [os.getcwd() if p == "" else p for p in sys.path]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if os.path.isdir(p))}


class HostMesh(MeshHandle):
    """Hosts of a cluster, in rank order, over ``extent``: ``{"hosts": N}`` for a
    cluster's hosts, ``{}`` for one host on its own (``this_host()`` of a one-host
    cluster, or ``slice(hosts=i)``), as in Monarch."""

    def __init__(self, cluster_id: str, hub_address: str, hosts: list[str], python: str | None = None,
                 extent: Extent | None = None):
        self._cluster_id = cluster_id
        self._hub_address = hub_address
        self._hosts = hosts
        self._name = "hosts"
        self._shape = Shape(Extent({"hosts": len(hosts)}) if extent is None else extent)
        self._python = python  # the interpreter procs run (None: this client's)
        # Proc meshes spawned through this handle (stop() ends them), and whether
        # shutdown() retired it. Per handle, like Monarch's owned host mesh: not pickled.
        self._spawned: list[ProcMesh] = []
        self._shut_down = False

    def __reduce__(self):
        return (HostMesh, (self._cluster_id, self._hub_address, self._hosts, self._python, self.extent))

    @property
    def is_fake_in_process(self) -> bool:
        """Always ``False``: procs spawned here are OS processes (Monarch also has host
        meshes simulated inside the client's process)."""
        return False

    def slice(self, **dims) -> "HostMesh":
        """Sub-mesh of hosts: ``slice(hosts=0)`` is host 0 with no dimensions,
        ``slice(hosts=slice(0, 2))`` hosts 0 and 1 over ``{"hosts": 2}``."""
        shape = self._shape.slice(**dims)
        return HostMesh(self._cluster_id, self._hub_address, [self._hosts[r] for r in shape.base_ranks()],
                        self._python, shape.extent)

    def with_python_executable(self, python_executable: str) -> "HostMesh":
        """The same hosts, whose procs spawned from the returned handle run
        ``python_executable`` (a path on every host; it must be able to import
        monarch_nb) instead of this client's interpreter. Never blocks."""
        if not isinstance(python_executable, str) or not python_executable:
            raise TypeError(f"with_python_executable takes an interpreter path, not {python_executable!r}")
        return HostMesh(self._cluster_id, self._hub_address, self._hosts, python_executable, self.extent)

    def spawn_procs(self, per_host: dict[str, int] | None = None, name: str | None = None,
                    replace: bool = False) -> ProcMesh:
        """Start ``per_host`` procs on every host (default ``{}``: one), all in parallel;
        returns a :class:`ProcMesh` over this mesh's extent followed by ``per_host``:
        ``{"hosts": N, **per_host}`` on a cluster's hosts, exactly ``per_host`` on one
        host with no dimensions (so ``this_host().spawn_procs(per_host={"hosts": 2,
        "gpus": 4})`` lays out 8 procs on this one host, as in Monarch). Blocks until
        every proc is up (at most ``SPAWN_TIMEOUT_S`` seconds).

        ``name`` names the mesh (default: generated); an existing name returns that live
        mesh when its extent matches, else raises ``ValueError`` unless ``replace=True``.
        Raises ``ValueError`` for bad ``per_host`` (labels must be identifiers, sizes
        ints >= 1, none of this mesh's labels) and :class:`ClusterError` when procs
        could not start.
        """
        if self._shut_down:
            raise RuntimeError("HostMesh has already been shut down; get a new one with this_host()")
        if per_host is None:
            per_host = {}
        elif not isinstance(per_host, Mapping):
            raise TypeError(f"per_host must be a dict of dimension sizes such as {{'gpus': 8}}, not {per_host!r}")
        per_host = dict(per_host)
        total = Extent(per_host).nelements * len(self._hosts)  # validates, with the user's frame on the stack
        spawn_id = secrets.token_hex(6)
        hub = self._hub()
        bar = progress.Later(runtime().bar_factory, f"spawning {total} procs", total,
                             lambda: hub.request(hub_ops.SPAWN_PROGRESS, timeout=5.0, spawn_id=spawn_id)["up"])
        try:
            reply = hub.request(
                hub_ops.SPAWN_PROCS, timeout=SPAWN_TIMEOUT_S, while_waiting=bar.tick, per_host=per_host, name=name,
                replace=replace, hosts=self._hosts, **{hub_ops.HOST_EXTENT: dict(self.extent)}, env=_proc_env(),
                cwd=os.getcwd(), python=self._python or sys.executable, spawn_id=spawn_id,
                owner=owner_of_new_meshes())
        except BaseException:
            bar.close(None)
            raise
        bar.close(total)
        procs = ProcMesh(self._cluster_id, self._hub_address, reply["name"], Shape(Extent(reply["extent"])),
                         reply["procs"])
        self._spawned.append(procs)
        return procs

    def stop(self) -> Future[None]:
        """Stop every proc mesh spawned through this handle (and their actors), leaving
        the hosts ready for new ones; proc meshes spawned otherwise (another handle,
        another client) keep running. Blocks until the procs have exited; returns a
        finished ``Future[None]`` (Monarch's return type)."""
        spawned, self._spawned = self._spawned, []
        for procs in spawned:
            procs.stop()
        return Future.finished(runtime(), "hosts.stop")

    def shutdown(self) -> Future[None]:
        """:meth:`stop`, then retire this handle: ``spawn_procs`` on it raises
        ``RuntimeError``. The hosts themselves (host agents) belong to the cluster and
        end with ``Cluster.stop()`` (or the script, for an ephemeral cluster). Blocks;
        returns a finished ``Future[None]``."""
        self.stop()
        self._shut_down = True
        return Future.finished(runtime(), "hosts.shutdown")

    def __repr__(self) -> str:
        return f"<HostMesh {dict(self.extent)}>"
