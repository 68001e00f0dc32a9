"""Extents, points and shapes of meshes.

A mesh is a row-major array of things (hosts, procs, actors) with named dimensions.
``Extent`` names the dimensions and their sizes; ``Point`` is one position in it;
``Shape`` is a strided view of a base mesh, which is what slicing produces: the view
maps each of its points to a rank of the base mesh (the same layout numpy uses for
basic slicing: an offset plus one stride per dimension).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Union


class Extent(Mapping):
    """Ordered mapping of dimension label to size, e.g. ``{"hosts": 2, "gpus": 8}``.

    Raises ``ValueError`` for a non-string label or a size below 1.
    """

    __slots__ = ("_labels", "_sizes")

    def __init__(self, sizes: Union[Mapping[str, int], "Extent"] = ()):
        labels, values = [], []
        for label, size in dict(sizes).items():
            if not isinstance(label, str) or not label.isidentifier():
                raise ValueError(f"mesh dimension label {label!r} must be an identifier string")
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ValueError(f"mesh dimension {label!r} has size {size!r}; sizes must be ints >= 1")
            labels.append(label)
            values.append(size)
        self._labels = tuple(labels)
        self._sizes = tuple(values)

    @property
    def labels(self) -> list[str]:
        """The dimension labels in order, as a new list (Monarch's type)."""
        return list(self._labels)

    @property
    def sizes(self) -> list[int]:
        """The dimension sizes in order, as a new list (Monarch's type)."""
        return list(self._sizes)

    @property
    def nelements(self) -> int:
        n = 1
        for s in self._sizes:
            n *= s
        return n

    def __getitem__(self, label: str) -> int:
        try:
            return self._sizes[self._labels.index(label)]
        except ValueError:
            raise KeyError(label) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __eq__(self, other) -> bool:
        if isinstance(other, Extent):
            return self._labels == other._labels and self._sizes == other._sizes
        if isinstance(other, Mapping):
            return list(self.items()) == list(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._labels, self._sizes))

    def __repr__(self) -> str:
        return "Extent({" + ", ".join(f"{l!r}: {s}" for l, s in zip(self._labels, self._sizes)) + "})"

    def point(self, rank: int) -> "Point":
        """The point at row-major ``rank``; ``IndexError`` when out of range."""
        if not 0 <= rank < self.nelements:
            raise IndexError(f"rank {rank} is out of range for {self!r} ({self.nelements} elements)")
        coords = []
        for size in reversed(self._sizes):
            coords.append(rank % size)
            rank //= size
        return Point(tuple(reversed(coords)), self)

    def points(self) -> Iterator["Point"]:
        """Every point, in rank order."""
        for rank in range(self.nelements):
            yield self.point(rank)

    def rank_of(self, coords: Mapping[str, int]) -> int:
        """Row-major rank of ``coords``, which must name every dimension exactly once."""
        if set(coords) != set(self._labels):
            raise KeyError(
                f"coordinates {dict(coords)} must name exactly the dimensions {list(self._labels)}"
            )
        rank = 0
        for label, size in zip(self._labels, self._sizes):
            i = coords[label]
            if not 0 <= i < size:
                raise IndexError(f"index {i} is out of range for dimension {label!r} of size {size}")
            rank = rank * size + i
        return rank

    def __reduce__(self):
        return (Extent, (dict(zip(self._labels, self._sizes)),))


class Point(Mapping):
    """One position in an :class:`Extent`: maps each label to an index.

    ``point.rank`` is the row-major index; ``point.extent`` the extent it lives in.
    """

    __slots__ = ("_coords", "_extent", "_rank")

    def __init__(self, coords: tuple[int, ...], extent: Extent):
        self._coords = tuple(coords)
        self._extent = extent
        self._rank: int | None = None  # computed on first use (an actor's replies all name it)

    @property
    def extent(self) -> Extent:
        return self._extent

    @property
    def rank(self) -> int:
        rank = self._rank
        if rank is None:
            rank = 0
            for i, size in zip(self._coords, self._extent._sizes):
                rank = rank * size + i
            self._rank = rank
        return rank

    def __getitem__(self, label: str) -> int:
        try:
            return self._coords[self._extent._labels.index(label)]
        except ValueError:
            raise KeyError(label) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._extent.labels)

    def __len__(self) -> int:
        return len(self._coords)

    def __eq__(self, other) -> bool:
        if isinstance(other, Point):
            return self._coords == other._coords and self._extent == other._extent
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._coords, self._extent))

    def __str__(self) -> str:
        """Monarch's form: each label with index/size, e.g. ``{'hosts': 0/1, 'gpus': 3/8}``."""
        return "{" + ", ".join(f"'{label}': {i}/{size}"
                               for label, i, size in zip(self._extent._labels, self._coords, self._extent._sizes)) + "}"

    def __repr__(self) -> str:
        return f"Point({self})"

    def __reduce__(self):
        return (Point, (self._coords, self._extent))


Index = Union[int, slice]


class Shape:
    """A strided view of a base mesh: ``extent`` plus the base rank of each point.

    ``offset`` and ``strides`` follow numpy's basic slicing: the point with
    coordinates ``c`` maps to base rank ``offset + sum(c[i] * strides[i])``.
    """

    __slots__ = ("extent", "offset", "strides", "_ranks", "_spec")

    def __init__(self, extent: Extent, offset: int = 0, strides: tuple[int, ...] | None = None):
        self.extent = extent
        self.offset = offset
        if strides is None:
            strides, acc = [], 1
            for size in reversed(extent.sizes):
                strides.append(acc)
                acc *= size
            strides = tuple(reversed(strides))
        self.strides = tuple(strides)
        self._ranks: list[int] | None = None  # computed on first use; shapes are immutable
        self._spec: tuple | None = None  # likewise (every call to a mesh sends it)

    @classmethod
    def of(cls, sizes: Mapping[str, int]) -> "Shape":
        """A dense row-major shape over ``sizes``."""
        return cls(Extent(sizes))

    def __len__(self) -> int:
        return self.extent.nelements

    def base_rank(self, rank: int) -> int:
        """Base-mesh rank of this view's ``rank``; ``IndexError`` when out of range."""
        if not 0 <= rank < len(self):
            raise IndexError(f"rank {rank} is out of range for {self.extent!r} ({len(self)} elements)")
        return self._base_list()[rank]

    def base_ranks_of(self, ranks: Iterable[int]) -> list[int]:
        """Base-mesh rank of each of this view's ``ranks``, in their order; ``IndexError``
        naming the first out of range. (One call for a whole call's ranks: a method call
        per rank was a client's largest cost per actor but one.)"""
        table = self._base_list()
        n, bases = len(table), []
        for rank in ranks:
            if not 0 <= rank < n:
                raise IndexError(f"rank {rank} is out of range for {self.extent!r} ({n} elements)")
            bases.append(table[rank])
        return bases

    def point_of_base(self, base: int) -> "Point | None":
        """The point of this view at base-mesh rank ``base``, ``None`` when the view
        does not hold it. O(dimensions): every actor of a mesh asks it of the view its
        first call was sent to, so a search of the view's points made that call cost
        O(actors) in each actor (1.3 ms at 256 actors; issue 24's first-call step)."""
        coords = self._coords_of_base(base)
        return None if coords is None else Point(coords, self.extent)

    def _coords_of_base(self, base: int) -> tuple[int, ...] | None:
        sizes, strides = self.extent._sizes, self.strides
        # A slice keeps the strides of a row-major base: each at least the span of the
        # dimensions after it, so each coordinate comes by one division, largest first.
        # A view of another layout (only a hand-made Shape) is searched point by point.
        if not all(s > 0 for s in strides) or any(a < b * n for a, b, n in zip(strides, strides[1:], sizes[1:])):
            try:
                return self.extent.point(self._base_list().index(base))._coords
            except ValueError:
                return None
        rest, coords = base - self.offset, []
        for size, stride in zip(sizes, strides):
            index = rest // stride if rest >= 0 else 0
            coords.append(min(index, size - 1))
            rest -= coords[-1] * stride
        return tuple(coords) if rest == 0 else None

    def spec(self) -> tuple:
        """``(labels, sizes, offset, strides)``: what :meth:`from_spec` makes it again
        from (plain tuples: a message header carries it)."""
        if self._spec is None:
            self._spec = (tuple(self.extent.labels), tuple(self.extent.sizes), self.offset, self.strides)
        return self._spec

    @classmethod
    def from_spec(cls, spec: tuple) -> "Shape":
        labels, sizes, offset, strides = spec
        return cls(Extent(dict(zip(labels, sizes))), offset, tuple(strides))

    def base_ranks(self) -> list[int]:
        """Base-mesh rank of every point of the view, in the view's rank order."""
        return list(self._base_list())

    def _base_list(self) -> list[int]:
        if self._ranks is None:
            self._ranks = [self.offset + sum(i * s for i, s in zip(p._coords, self.strides))
                           for p in self.extent.points()]
        return self._ranks

    def flatten(self, label: str) -> "Shape":
        """The same points as one dimension ``label``, in this view's rank order. Raises
        ``ValueError`` when the view's base ranks are not evenly spaced (a slice that
        one stride can't describe)."""
        ranks = self._base_list()
        step = ranks[1] - ranks[0] if len(ranks) > 1 else 1
        if any(b - a != step for a, b in zip(ranks, ranks[1:])):
            raise ValueError(f"can't flatten {self.extent!r}: its ranks {ranks} are not evenly spaced")
        return Shape(Extent({label: len(ranks)}), ranks[0] if ranks else 0, (step,))

    def slice(self, **dims: Index) -> "Shape":
        """A sub-view. An int selects one index and drops that dimension (a negative one
        counts from the end, as in Python: ``gpus=-1`` is the last); a slice (step >= 1)
        keeps it. Raises ``ValueError`` for an unknown dimension and
        ``IndexError`` for an out-of-range or empty selection."""
        unknown = [d for d in dims if d not in self.extent]
        if unknown:
            raise ValueError(
                f"mesh has no dimension {', '.join(map(repr, unknown))}; its dimensions are "
                f"{list(self.extent.labels)} (extent {dict(self.extent)})"
            )
        offset = self.offset
        sizes: dict[str, int] = {}
        strides: list[int] = []
        for label, size, stride in zip(self.extent.labels, self.extent.sizes, self.strides):
            if label not in dims:
                sizes[label] = size
                strides.append(stride)
                continue
            sel = dims[label]
            if isinstance(sel, bool) or not isinstance(sel, (int, slice)):
                raise TypeError(
                    f"slice({label}=...) takes an int or a slice, not {type(sel).__name__}"
                )
            if isinstance(sel, int):
                index = sel + size if sel < 0 else sel
                if not 0 <= index < size:
                    raise IndexError(
                        f"index {sel} is out of range for dimension {label!r} of size {size}"
                    )
                offset += index * stride
                continue
            start, stop, step = sel.indices(size)
            if step < 1:
                raise IndexError(f"slice({label}=...) needs a positive step, got {step}")
            n = len(range(start, stop, step))
            if n == 0:
                raise IndexError(
                    f"slice {sel.start}:{sel.stop}:{sel.step} selects nothing from dimension "
                    f"{label!r} of size {size}"
                )
            offset += start * stride
            sizes[label] = n
            strides.append(stride * step)
        return Shape(Extent(sizes), offset, tuple(strides))

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, Shape)
            and self.extent == other.extent
            and self.base_ranks() == other.base_ranks()
        )

    def __repr__(self) -> str:
        return f"Shape({dict(self.extent)}, ranks={self.base_ranks()})"

    def __reduce__(self):
        return (Shape, (self.extent, self.offset, self.strides))
