"""Rank lists as people write them: ``"0-3,5,7-8"``."""

from __future__ import annotations

import math
from collections.abc import Mapping


def format_ranks(ranks) -> str:
    """``[0, 1, 2, 3, 5, 7, 8]`` -> ``"0-3,5,7-8"`` (sorted, duplicates dropped)."""
    parts = []
    ranks = sorted(set(ranks))
    start = prev = None
    for r in ranks + [None]:
        if start is not None and (r is None or r != prev + 1):
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if r is not None and start is None:
            start = r
        prev = r
    return ",".join(parts)


def parse_ranks(spec: str, size: int | None = None) -> list[int]:
    """``"0-3,5"`` -> ``[0, 1, 2, 3, 5]``. Raises ``ValueError`` naming the bad part,
    or a rank not below ``size`` when given."""
    ranks: list[int] = []
    for part in spec.replace(" ", "").split(","):
        lo, dash, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise ValueError(f"bad rank spec {spec!r}: {part!r} is not N or N-M (e.g. '0-3,5')") from None
        if first < 0 or last < first:
            raise ValueError(f"bad rank spec {spec!r}: {part!r} is not an increasing range of ranks >= 0")
        if size is not None and last >= size:
            raise ValueError(f"bad rank spec {spec!r}: rank {last} is out of range for {size} ranks (0-{size - 1})")
        ranks.extend(range(first, last + 1))
    return sorted(set(ranks))


def parse_ranks_of(spec: str, mesh: str, extent: Mapping[str, int]) -> list[int]:
    """:func:`parse_ranks` for mesh ``mesh`` of ``extent`` (dimension label -> size, in
    order): flat ranks below its size. A spec naming a dimension (``"gpus=0"``) raises
    ``ValueError`` naming the mesh's dimensions and, for one it has, the flat ranks
    meant; so does a rank out of range."""
    dimensions = ", ".join(f"{label}={size}" for label, size in extent.items())
    size = math.prod(extent.values())
    label, equals, value = spec.partition("=")
    if not equals:
        return parse_ranks(spec, size)
    label = label.strip()
    if label not in extent:
        raise ValueError(f"bad rank spec {spec!r}: {label!r} is not a dimension of {mesh} (dimensions: {dimensions}); "
                         f"give ranks among its {size}, e.g. '0-{size - 1}'")
    labels = list(extent)
    stride = math.prod(list(extent.values())[labels.index(label) + 1:])
    try:
        chosen = set(parse_ranks(value, extent[label]))
    except ValueError:
        meant = ""
    else:
        flat = format_ranks(r for r in range(size) if r // stride % extent[label] in chosen)
        meant = f": {label}={value} is ranks '{flat}'"
    raise ValueError(f"bad rank spec {spec!r}: give ranks among the {size} of {mesh} (dimensions: {dimensions}), "
                     f"not coordinates{meant}")
