"""``ValueMesh``: one value per point of a mesh, what ``call()`` returns."""

from __future__ import annotations

from typing import Any, Generic, Iterator, TypeVar

from ..mesh import Extent, Point, Shape

R = TypeVar("R")


class ValueMesh(Generic[R]):
    """Values laid out over ``extent`` in rank order.

    ``items()`` yields ``(Point, value)``; ``item(gpus=3)`` picks one value by
    coordinates (every dimension must be named); ``len()`` is the number of points;
    ``slice(...)`` and ``flatten(...)`` reshape it as they do an actor mesh.
    """

    def __init__(self, extent: Extent, values: list[R]):
        if len(values) != extent.nelements:
            raise ValueError(f"{len(values)} values do not fill extent {dict(extent)}")
        self._extent = extent
        self._values = list(values)

    @property
    def extent(self) -> Extent:
        return self._extent

    def items(self) -> Iterator[tuple[Point, R]]:
        return zip(self._extent.points(), self._values)

    def values(self) -> list[R]:
        return list(self._values)

    def item(self, **coords: int) -> R:
        """The value at ``coords``; raises ``KeyError``/``IndexError`` naming the problem.
        A mesh of one point needs no coordinates."""
        if not coords and len(self._values) == 1:
            return self._values[0]
        return self._values[self._extent.rank_of(coords)]

    def slice(self, **dims) -> "ValueMesh[R]":
        """The values of a sub-mesh: an int drops that dimension, a slice keeps it
        (``vm.slice(gpus=1).item()``). Raises as ``ActorMesh.slice`` does."""
        shape = Shape(self._extent).slice(**dims)
        return ValueMesh(shape.extent, [self._values[r] for r in shape.base_ranks()])

    def flatten(self, name: str) -> "ValueMesh[R]":
        """The same values, in rank order, over one dimension ``name``."""
        return ValueMesh(Extent({name: len(self._values)}), self._values)

    def __iter__(self) -> Iterator[tuple[Point, R]]:
        return self.items()

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ValueMesh) and self._extent == other._extent and self._values == other._values

    def __repr__(self) -> str:
        shown = ", ".join(f"{p}: {v!r}" for p, v in list(self.items())[:8])
        more = f", ... ({len(self) - 8} more)" if len(self) > 8 else ""
        return f"ValueMesh({dict(self._extent)}, {{{shown}{more}}})"

    def __reduce__(self):
        return (ValueMesh, (self._extent, self._values))
