"""TorchFT as the quorum of replica groups, when ``torchft`` is installed: its lighthouse
runs as an actor in the cluster, and every proc of every group is given the variables
TorchFT's own launchers set, so that a ``torchft.Manager`` made in an actor's
``__init__`` joins that lighthouse as its group's member of the quorum.

The variables are TorchFT's names: ``TORCHFT_LIGHTHOUSE`` (the lighthouse's URL, read
by ``torchft.Manager`` when it is given no ``lighthouse_addr``), ``REPLICA_GROUP_ID``
(the group's index, 0..N-1) and ``NUM_REPLICA_GROUPS`` (N), as TorchFT's examples read
them. ``MASTER_ADDR``/``MASTER_PORT``, which the Manager uses for its group's store,
come from ``setup_torch_distributed`` (``ReplicaGroups(backend=...)``).

Imports torchft only in the proc that runs the lighthouse, and where
:func:`require_torchft` checks for it.
"""

from __future__ import annotations

import functools
import os

from ..client.endpoint import endpoint
from ..client.host_mesh import HostMesh
from ..client.proc_mesh import ProcMesh
from ..proc.actor import Actor

LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
GROUP_ENV = "REPLICA_GROUP_ID"
GROUPS_ENV = "NUM_REPLICA_GROUPS"


def require_torchft() -> None:
    """Raises ``ImportError`` naming the fix when ``torchft`` can't be imported here."""
    try:
        import torchft  # noqa: F401
    except ImportError as e:
        raise ImportError(f"quorum='torchft' needs TorchFT, which does not import here ({e}): "
                          "pip install 'monarch_nb[torchft]' (or pip install torchft), or leave quorum at "
                          "'controller' (the controller's own quorum)") from e


class Lighthouse(Actor):
    """TorchFT's lighthouse server in this proc, bound to every interface on a free port.
    ``min_replicas``: groups a quorum needs; ``join_timeout_ms``: how long a quorum
    waits for more groups than ``min_replicas`` to join; ``heartbeat_timeout_ms``: how
    long a silent group stays a member. Raises ``ImportError`` without torchft."""

    def __init__(self, min_replicas: int, join_timeout_ms: int, quorum_tick_ms: int, heartbeat_timeout_ms: int):
        from torchft.coordination import LighthouseServer

        self._server = LighthouseServer(bind="[::]:0", min_replicas=min_replicas, join_timeout_ms=join_timeout_ms,
                                        quorum_tick_ms=quorum_tick_ms, heartbeat_timeout_ms=heartbeat_timeout_ms)

    @endpoint
    def address(self) -> str:
        """The URL managers join, e.g. ``http://host:port``."""
        return self._server.address()


class GroupEnv(Actor):
    """Sets a group's variables in procs started before their group was known (a warm
    spare), before the group's own actors start."""

    def __init__(self, env: dict[str, str]):
        export_env(env)


class TorchFTLighthouse:
    """A lighthouse actor on its own proc of ``hosts`` (its first host), named
    ``{name}_lighthouse``; ``address`` is its URL. Blocks until it serves. Raises
    ``ImportError`` without torchft (here or in the proc), ``ValueError`` for
    ``min_replicas < 1``."""

    def __init__(self, hosts: HostMesh, name: str, min_replicas: int = 1, join_timeout_ms: int = 100,
                 quorum_tick_ms: int = 100, heartbeat_timeout_ms: int = 5000):
        if min_replicas < 1:
            raise ValueError(f"TorchFT lighthouse: min_replicas={min_replicas}; give at least 1 group")
        require_torchft()
        self.procs: ProcMesh = hosts.spawn_procs(name=f"{name}_lighthouse")
        try:
            self.actor = self.procs.spawn("lighthouse", Lighthouse, min_replicas, join_timeout_ms, quorum_tick_ms,
                                          heartbeat_timeout_ms, raise_init_errors=True)
            self.address: str = self.actor.address.call_one().get()
        except BaseException:
            self.procs.stop()
            raise

    def group_env(self, index: int, num_groups: int) -> dict[str, str]:
        """The variables of group ``index`` of ``num_groups``."""
        return {LIGHTHOUSE_ENV: self.address, GROUP_ENV: str(index), GROUPS_ENV: str(num_groups)}

    def bootstrap(self, index: int, num_groups: int) -> functools.partial:
        """A ``spawn_procs(bootstrap=...)`` function setting :meth:`group_env` in each proc."""
        return functools.partial(export_env, self.group_env(index, num_groups))

    def export_to(self, procs: ProcMesh, index: int, num_groups: int) -> None:
        """Set :meth:`group_env` in running ``procs`` (a warm spare taken for group
        ``index``). Blocking."""
        procs.spawn("torchft_env", GroupEnv, self.group_env(index, num_groups), raise_init_errors=True)

    def stop(self) -> None:
        self.procs.stop()


def export_env(env: dict[str, str]) -> None:
    """Set ``env`` in this process (run in each new proc, before its actors start)."""
    os.environ.update(env)
