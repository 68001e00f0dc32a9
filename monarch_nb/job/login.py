"""Jobs over hosts you name: ``LoginJob`` (agents started through a command prefix per
host) and ``SSHJob`` (that prefix is ``ssh HOST``), through
:class:`~monarch_nb.allocators.command.CommandAllocator`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..allocators.command import CommandAllocator
from ..wire import interfaces
from .cluster_job import ClusterJob, check_meshes


class LoginJob(ClusterJob):
    """Hosts given by name: ``job.add_mesh("trainers", ["node1", "node2"])``. A
    subclass says how to run a command on a host (:meth:`_command_prefix`). Each host
    runs a host agent with this client's Python (``sys.executable``): the environment
    and the cluster directory must be at the same paths there (a shared filesystem).

    ``bind``: the address of this machine the hosts reach the hub at (default: the
    local address that routes to the first host). ``cluster``: run as the retained
    cluster of that name instead of an ephemeral one."""

    def __init__(self, *, bind: str | None = None, cluster: str | None = None):
        super().__init__()
        self._host_names: dict[str, list[str]] = {}
        self._meshes: dict[str, int] = {}
        self._bind = bind
        self._cluster_name = cluster

    def add_mesh(self, name: str, hosts: list[str]) -> None:
        """Name the hosts (in ``hosts``-dimension order) of the mesh ``name``."""
        self._meshes = check_meshes({**self._meshes, name: len(hosts)})
        self._host_names[name] = [str(h) for h in hosts]

    def _command_prefix(self, host: str) -> list[str]:
        """The words that run a command on ``host``, e.g. ``["ssh", host]``; subclasses give it."""
        raise NotImplementedError(
            f"{type(self).__name__} does not say how to run a command on a host: give it "
            "_command_prefix(host) -> ['ssh', host] or the like (Monarch's _start_host(host) -> ProcessState, "
            "which starts a Monarch worker by hand, has no monarch_nb equivalent)")

    def _allocator(self) -> CommandAllocator:
        hosts = [h for names in self._host_names.values() for h in names]
        if not hosts:
            raise ValueError("this job has no hosts: call job.add_mesh(name, [host, ...]) first")
        prefixes = [self._command_prefix(h) for h in hosts]
        return CommandAllocator(prefixes, bind=self._bind or _route_to(hosts[0]))

    def _same_allocation(self, spec: ClusterJob) -> bool:
        return (super()._same_allocation(spec) and spec._host_names == self._host_names
                and spec._bind == self._bind)


def _route_to(host: str) -> str:
    """The local address that routes to ``host``, where the hub binds by default."""
    try:
        return interfaces.route_source(host)
    except OSError as e:
        raise ValueError(f"no route to host {host!r} to choose the hub's address ({e}); "
                         "give the job bind='ADDRESS OF THIS MACHINE THE HOSTS REACH'") from None


class SSHJob(LoginJob):
    """Hosts reached with ``ssh [ssh_args] HOST`` (keys set up, no password prompt).

    ``monarch_port`` is accepted and unused (agents pick their ports); ``transport``
    must be ``"tcp"`` (frames are signed with the cluster key, not encrypted); another
    ``python_exe`` raises ``NotImplementedError`` (agents run this client's Python)."""

    def __init__(self, python_exe: str = "python", ssh_args: Sequence[str] = (), monarch_port: int = 22222,
                 transport: str = "tcp", *, bind: str | None = None, cluster: str | None = None):
        if transport != "tcp":
            raise NotImplementedError(f"monarch_nb's SSHJob has no transport={transport!r}: only 'tcp'")
        if python_exe not in ("python", sys.executable):
            raise NotImplementedError(f"monarch_nb's SSHJob has no python_exe={python_exe!r}: host agents run "
                                      f"this client's {sys.executable}, at the same path on every host")
        super().__init__(bind=bind, cluster=cluster)
        self._ssh_args = [str(a) for a in ssh_args]

    def _command_prefix(self, host: str) -> list[str]:
        return ["ssh", *self._ssh_args, host]

    def _same_allocation(self, spec: ClusterJob) -> bool:
        return super()._same_allocation(spec) and spec._ssh_args == self._ssh_args
