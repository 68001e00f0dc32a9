"""``ValueMesh``: one value per point of a mesh, what ``call()`` returns."""

from __future__ import annotations

import html
import reprlib
from typing import Any, Generic, Iterator, TypeVar

from ..mesh import Extent, Point, Shape

R = TypeVar("R")
REPR_POINTS, REPR_CHARS = 8, 60  # the text repr: how many points, how long a value
HTML_POINTS, HTML_CHARS = 64, 200  # the HTML table's


def _short(value: Any, limit: int) -> str:
    """``value``'s repr in at most ``limit`` characters, never building a huge one."""
    shorter = reprlib.Repr()
    shorter.maxstring = shorter.maxother = limit
    shorter.maxlist = shorter.maxtuple = shorter.maxdict = shorter.maxset = max(6, limit // 10)
    text = shorter.repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


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

    def get(self, rank: int) -> R:
        """The value at ``rank``, this mesh's row-major index (0 to ``len - 1``), as in
        Monarch. Raises ``TypeError`` for a rank that is not an int, ``IndexError``
        naming the valid range otherwise."""
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"ValueMesh.get takes an int rank, not {rank!r}; use item(**coords) for coordinates")
        if not 0 <= rank < len(self._values):
            raise IndexError(f"rank {rank} is not in this ValueMesh of {len(self._values)} values "
                             f"(ranks 0-{len(self._values) - 1}, extent {dict(self._extent)})")
        return self._values[rank]

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
        """Short: the first ``REPR_POINTS`` points, each value's repr cut to
        ``REPR_CHARS`` characters."""
        shown = ", ".join(f"{p}: {_short(v, REPR_CHARS)}" for p, v in list(self.items())[:REPR_POINTS])
        more = f", ... ({len(self) - REPR_POINTS} more)" if len(self) > REPR_POINTS else ""
        return f"ValueMesh({dict(self._extent)}, {{{shown}{more}}})"

    def _repr_html_(self) -> str:
        """A table by point (one column per dimension, then the value), the first
        ``HTML_POINTS`` rows, each value's repr cut to ``HTML_CHARS`` characters."""
        labels = self._extent.labels
        head = "".join(f"<th>{html.escape(label)}</th>" for label in labels) + "<th>value</th>"
        rows = ["<tr>" + "".join(f"<td>{point[label]}</td>" for label in labels)
                + f"<td style='text-align:left'><code>{html.escape(_short(value, HTML_CHARS))}</code></td></tr>"
                for point, value in list(self.items())[:HTML_POINTS]]
        if len(self) > HTML_POINTS:
            rows.append(f"<tr><td colspan='{len(labels) + 1}'>... {len(self) - HTML_POINTS} more</td></tr>")
        return (f"<div><b>ValueMesh</b> {html.escape(str(dict(self._extent)))}"
                f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")

    def __reduce__(self):
        return (ValueMesh, (self._extent, self._values))
