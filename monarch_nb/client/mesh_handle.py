"""What every mesh handle (host, proc, actor) shares: its cluster, name and shape."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from ..errors import InvalidRequest
from ..mesh import Extent, Shape
from .control import ControlPlane
from .hub_client import HubClient, HubControl
from .runtime import runtime

LOCAL_PREFIX = "local-"  # the cluster id of this_proc(): no hub, no cluster directory


def is_this_proc(cluster_id: str) -> bool:
    """True for handles of this_proc() meshes (and their actors)."""
    return cluster_id.startswith(LOCAL_PREFIX)


class MeshHandle:
    """Base of ``HostMesh``, ``ProcMesh`` and ``ActorMesh``: plain data that pickles, so
    a handle can be passed to actors in other processes."""

    _cluster_id: str
    _hub_address: str
    _name: str
    _shape: Shape

    @property
    def name(self) -> str:
        return self._name

    @property
    def extent(self) -> Extent:
        """Dimension labels to sizes, e.g. ``{"hosts": 2, "gpus": 8}``."""
        return self._shape.extent

    def __len__(self) -> int:
        return len(self._shape)

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """How many points: in all (``None``), along ``dim``, or along several dims.
        Raises ``KeyError`` for a dimension the mesh doesn't have."""
        if dim is None:
            return len(self._shape)
        return prod(self.extent[d] for d in ([dim] if isinstance(dim, str) else dim))

    def _hub(self) -> HubClient:
        return HubClient(self._cluster_id, self._hub_address)

    def _control(self) -> ControlPlane:
        """The control plane of this handle's cluster: its hub, or this process for
        ``this_proc()`` meshes."""
        if is_this_proc(self._cluster_id):
            plane = runtime().local_planes.get(self._cluster_id)
            if plane is None:
                raise InvalidRequest(f"{self!r} is a this_proc() mesh of another process (or of this one "
                                   "before a fork); only that process can control it")
            return plane
        return HubControl(self._cluster_id, self._hub_address)
