"""``HostMesh``: the hosts of a cluster; spawns proc meshes on them."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Mapping
from typing import Awaitable, Callable

from ..mesh import Extent, Shape
from ..proc.actor import owner_of_new_meshes
from ..proc.setup_actor import check_bind
from ..protocol import gpus, hub_ops, services
from . import bootstrap_command as bootstrap_cmd
from . import progress
from .bootstrap_command import PYTHON_ENV
from .future import Future
from .mesh_handle import MeshHandle
from .proc_mesh import ProcMesh
from .runtime import runtime

SPAWN_TIMEOUT_S = 120.0


def _proc_env(python: str | None) -> dict[str, str]:
    """Let procs import what this client imports (its ``sys.path``), and spawn their own
    procs with ``python`` (None: the default interpreter)."""
    paths = [os.getcwd() if p == "" else p for p in sys.path]
    env = {"PYTHONPATH": os.pathsep.join(p for p in paths if os.path.isdir(p))}
    if python is not None:
        env[PYTHON_ENV] = python
    return env


def _gpu_options(per_host: dict, bind_gpus: bool, gpus_per_proc: float) -> dict:
    """The spawn request's GPU fields; ``TypeError``/``ValueError`` for options of the
    wrong type or given without a ``"gpus"`` dimension (the hub checks the numbers)."""
    if not isinstance(bind_gpus, bool):
        raise TypeError(f"bind_gpus={bind_gpus!r}: give True (one GPU per proc of a 'gpus' dimension) or False")
    if isinstance(gpus_per_proc, bool) or not isinstance(gpus_per_proc, (int, float)):
        raise TypeError(f"gpus_per_proc={gpus_per_proc!r}: give a number of GPUs per proc (1, 2) or a fraction "
                        "1/k for k procs per GPU (0.5)")
    if gpus_per_proc != 1 and "gpus" not in per_host:
        raise ValueError(f"gpus_per_proc={gpus_per_proc!r} applies to the procs of a 'gpus' dimension, and "
                         f"per_host={per_host} has none; name the dimension 'gpus', e.g. per_host={{'gpus': 8}}")
    return {gpus.BIND_GPUS: bind_gpus, gpus.GPUS_PER_PROC: gpus_per_proc}


class HostMesh(MeshHandle):
    """Hosts of a cluster, in rank order, over ``extent``: ``{"hosts": N}`` for a
    cluster's hosts, ``{}`` for one host on its own (``this_host()`` of a one-host
    cluster, or ``slice(hosts=i)``), as in Monarch.

    As in Monarch, a handle is *owned* (``this_host()``, a job's host meshes: it may be
    shut down) or a *reference* (a slice, or a handle unpickled from another process:
    ``shutdown()`` raises ``RuntimeError``). ``async with hosts:`` shuts an owned one down
    on exit."""

    def __init__(self, cluster_id: str, hub_address: str, hosts: list[str], python: str | None = None,
                 extent: Extent | None = None, owned: bool = True):
        self._cluster_id = cluster_id
        self._hub_address = hub_address
        self._hosts = hosts
        self._name = "hosts"
        self._shape = Shape(Extent({"hosts": len(hosts)}) if extent is None else extent)
        self._python = python  # the interpreter procs run (None: this client's)
        self._owned = owned
        # Proc meshes spawned through this handle (stop() ends them), and whether
        # shutdown() retired it. Per handle, like Monarch's owned host mesh: not pickled.
        self._spawned: list[ProcMesh] = []
        self._shut_down = False
        # What shutdown() also ends: the cluster made for this mesh alone (attach_to_workers).
        self._release: Callable[[], None] | None = None

    def __reduce__(self):
        return (HostMesh, (self._cluster_id, self._hub_address, self._hosts, self._python, self.extent, False))

    @property
    def _inner_host_mesh(self) -> list[str] | None:
        """The hosts this handle drives, ``None`` once shut down (Monarch's attribute,
        read by programs to tell a live host mesh from a shut-down one)."""
        return None if self._shut_down else self._hosts

    @property
    def initialized(self) -> Future[bool]:
        """A finished ``Future`` of ``True``: the hosts were up when this handle was made
        (Monarch's host meshes come up in the background). Raises ``RuntimeError`` once
        shut down."""
        self._check_live()
        return Future.finished(runtime(), "hosts.initialized", True)

    def _check_live(self) -> None:
        if self._shut_down:
            raise RuntimeError("HostMesh has already been shut down; get a new one with this_host()")

    @property
    def is_fake_in_process(self) -> bool:
        """Always ``False``: procs spawned here are OS processes (Monarch also has host
        meshes simulated inside the client's process)."""
        return False

    @property
    def stream_logs(self) -> bool:
        """Whether what procs of this mesh print reaches this client: always ``True``
        (Monarch's flag, fixed here). A line an actor prints while handling a call from
        this client is shown by it (under the cell that made the call, in a notebook),
        and every line is kept in the hub's log store (``Cluster.logs``) either way."""
        return True

    def slice(self, **dims) -> "HostMesh":
        """Sub-mesh of hosts: ``slice(hosts=0)`` is host 0 with no dimensions,
        ``slice(hosts=slice(0, 2))`` hosts 0 and 1 over ``{"hosts": 2}``."""
        return self._sliced(dims, owned=False)

    def _owned_slice(self, **dims) -> "HostMesh":
        """:meth:`slice`, owning its hosts: what a cluster or a job hands out."""
        return self._sliced(dims, owned=True)

    def _sliced(self, dims: dict, owned: bool) -> "HostMesh":
        shape = self._shape.slice(**dims)
        return HostMesh(self._cluster_id, self._hub_address, [self._hosts[r] for r in shape.base_ranks()],
                        self._python, shape.extent, owned)

    def with_python_executable(self, python_executable: str) -> "HostMesh":
        """The same hosts, whose procs spawned from the returned handle run
        ``python_executable`` (a path on every host; it must be able to import
        monarch_nb) instead of this client's interpreter. Never blocks."""
        if not isinstance(python_executable, str) or not python_executable:
            raise TypeError(f"with_python_executable takes an interpreter path, not {python_executable!r}")
        return HostMesh(self._cluster_id, self._hub_address, self._hosts, python_executable, self.extent,
                        self._owned)

    def spawn_procs(self, per_host: dict[str, int] | None = None,
                    bootstrap: Callable[[], None] | Callable[[], Awaitable[None]] | None = None,
                    name: str | None = None, proc_bind: list[dict[str, str]] | None = None,
                    replace: bool = False, bootstrap_command: bootstrap_cmd.PerRank | None = None,
                    bind_gpus: bool = True,
                    gpus_per_proc: float = 1, _service: dict | None = None) -> ProcMesh:
        """Start ``per_host`` procs on every host (default ``{}``: one), all in parallel;
        returns a :class:`ProcMesh` over this mesh's extent followed by ``per_host``:
        ``{"hosts": N, **per_host}`` on a cluster's hosts, exactly ``per_host`` on one
        host with no dimensions (so ``this_host().spawn_procs(per_host={"hosts": 2,
        "gpus": 4})`` lays out 8 procs on this one host, as in Monarch). Blocks until
        every proc is up (at most ``SPAWN_TIMEOUT_S`` seconds).

        ``name`` names the mesh (default: generated); an existing name returns that live
        mesh when its extent matches, else raises ``ValueError`` unless ``replace=True``.

        ``bootstrap`` (a picklable function, or an ``async def`` one) runs once in every
        new proc before this returns, e.g. to set up state or spawn actors with
        ``this_proc()`` that live as long as the proc; what it raises is not raised
        here but by ``procs.initialized`` (as in Monarch). ``proc_bind`` pins each proc
        of a host to CPUs: one dict per proc of a host, keyed ``cpus`` or
        ``physcpubind`` (a CPU list such as ``"0-3,8"``) or ``cpunodebind`` (NUMA
        nodes).

        Procs of a ``"gpus"`` dimension each get a GPU of their host (see
        docs/gpus.md): ``CUDA_VISIBLE_DEVICES`` names the host's ``i``-th GPU for its
        ``i``-th proc (of the GPUs no other mesh's live procs hold), and RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK
        and GROUP_WORLD_SIZE are set as ``setup_torch_distributed`` sets them (a host
        without GPUs gets those alone). ``gpus_per_proc`` gives each proc that many GPUs
        (2: two each), or lets procs share one (0.5: two per GPU); ``bind_gpus=False``
        sets no ``CUDA_VISIBLE_DEVICES`` (every proc sees every GPU of its host). A
        host's GPUs are the ``CUDA_VISIBLE_DEVICES`` its host agent was started with,
        else the machine's (NVML, nvidia-smi); host agents on one machine split them.

        ``_service`` (``monarch_nb.service``'s, not for users): the hub keeps this record
        of the service the mesh is a replica of (``protocol.services``).

        Raises ``ValueError`` when a host with GPUs has fewer than its procs need
        (naming both numbers), before any proc starts; for bad ``per_host`` (labels must be identifiers, sizes
        ints >= 1, none of this mesh's labels, at most ``MAX_PROCS_PER_HOST`` = 1024 procs
        per host unless ``$MONARCH_NB_MAX_PROCS_PER_HOST`` says more) or ``proc_bind`` (its length, or a
        memory-binding key, which monarch_nb does not apply), and
        :class:`ClusterError` when procs could not start.

        ``bootstrap_command`` (Monarch's): a :class:`BootstrapCommand` for every proc,
        or a function of a proc's :class:`Point` in the new mesh returning one (called
        here, once per proc, before any starts); start from ``default_bootstrap_cmd()``.
        Its ``env`` is set in the proc over what it inherits and over its GPU binding
        (``{"CUDA_VISIBLE_DEVICES": str(point["gpus"])}`` picks a GPU per rank), its
        ``program`` is the interpreter (as :meth:`with_python_executable`). Raises
        ``NotImplementedError`` for another ``arg0`` or ``args`` than the default's, or
        interpreters that differ between procs (see ``bootstrap_command.per_rank``).
        """
        self._check_live()
        if per_host is None:
            per_host = {}
        elif not isinstance(per_host, Mapping):
            raise TypeError(f"per_host must be a dict of dimension sizes such as {{'gpus': 8}}, not {per_host!r}")
        per_host = dict(per_host)
        per_proc_host = Extent(per_host).nelements  # validates, with the user's frame on the stack
        hub_ops.check_procs_per_host(per_host, per_proc_host)
        if proc_bind is not None:
            check_bind(proc_bind, per_proc_host)
        gpu_options = _gpu_options(per_host, bind_gpus, gpus_per_proc)
        total = per_proc_host * len(self._hosts)
        python = self._python or os.environ.get(PYTHON_ENV)
        rank_env = {}
        if bootstrap_command is not None:
            python, envs = bootstrap_cmd.per_rank(bootstrap_command, Extent({**dict(self.extent), **per_host}))
            rank_env = {hub_ops.RANK_ENV: envs}
        spawn_id = secrets.token_hex(6)
        hub = self._hub()
        bar = progress.Later(runtime().bar_factory, f"spawning {total} procs", total,
                             lambda: hub.request(hub_ops.SPAWN_PROGRESS, timeout=5.0, spawn_id=spawn_id)["up"])
        try:
            reply = hub.request(
                hub_ops.SPAWN_PROCS, timeout=SPAWN_TIMEOUT_S, while_waiting=bar.tick, per_host=per_host, name=name,
                replace=replace, hosts=self._hosts, **{hub_ops.HOST_EXTENT: dict(self.extent)}, env=_proc_env(python),
                cwd=os.getcwd(), python=python or sys.executable, spawn_id=spawn_id,
                owner=owner_of_new_meshes(), **gpu_options, **rank_env,
                **({services.SERVICE: _service} if _service else {}))
        except BaseException:
            bar.close(None)
            raise
        bar.close(total)
        procs = ProcMesh(self._cluster_id, self._hub_address, reply["name"], Shape(Extent(reply["extent"])),
                         reply["procs"])
        self._spawned.append(procs)
        if bootstrap is not None or proc_bind is not None:
            procs._run_setup(proc_bind, per_proc_host, bootstrap)
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
        returns a finished ``Future[None]``. Raises ``RuntimeError`` on a reference (a
        slice, an unpickled handle) and on a handle already shut down, as in Monarch.
        The mesh of ``attach_to_workers`` ends its cluster, and so its workers."""
        if not self._owned:
            raise RuntimeError("cannot shut down `HostMesh` that is a reference instead of owned (a slice, or a "
                               "handle received from another process); shut down the host mesh it came from")
        self._check_live()
        self.stop()
        self._shut_down = True
        if self._release is not None:
            self._release()
        return Future.finished(runtime(), "hosts.shutdown")

    async def __aenter__(self) -> "HostMesh":
        self._check_live()
        return self

    async def __aexit__(self, *exc_info) -> None:
        if not self._shut_down:  # nested `async with` blocks shut down once
            self.shutdown()

    def __repr__(self) -> str:
        return f"<HostMesh {dict(self.extent)}>"
