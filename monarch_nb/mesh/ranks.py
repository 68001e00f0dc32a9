"""Rank lists as people write them: ``"0-3,5,7-8"``."""

from __future__ import annotations


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
