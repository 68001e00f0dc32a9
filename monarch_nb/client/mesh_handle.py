"""What every mesh handle (host, proc, actor) shares: its cluster, name and shape."""

from __future__ import annotations

from ..mesh import Extent, Shape
from .hub_client import HubClient


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
        """Dimension labels to sizes, e.g. ``{"hosts": 1, "gpus": 8}``."""
        return self._shape.extent

    def __len__(self) -> int:
        return len(self._shape)

    def _hub(self) -> HubClient:
        return HubClient(self._cluster_id, self._hub_address)
