"""A point's place in torch elastic's terms (what torchrun sets for each worker),
computed from its mesh's extent. Pure arithmetic, no environment touched."""

from __future__ import annotations

from .shape import Extent

HOSTS = "hosts"  # the dimension whose index is the host ("node"); the others count procs on it


def elastic_ranks(extent: Extent, rank: int) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK and GROUP_WORLD_SIZE
    of ``rank`` (row-major) in a mesh over ``extent``, as strings.

    With a ``hosts`` dimension, GROUP_RANK is the point's host index, LOCAL_RANK its
    rank among the other dimensions (its place on its host) and LOCAL_WORLD_SIZE their
    size; without one (e.g. ``procs.slice(hosts=0)``) the whole mesh is on one host.
    Raises ``IndexError`` for a rank outside the extent."""
    point = extent.point(rank)
    if HOSTS in extent:
        local = Extent({label: size for label, size in extent.items() if label != HOSTS})
        local_rank = local.rank_of({label: point[label] for label in local}) if len(local) else 0
        group_rank, groups = point[HOSTS], extent[HOSTS]
    else:
        local, local_rank, group_rank, groups = extent, rank, 0, 1
    return {"RANK": str(rank), "WORLD_SIZE": str(extent.nelements), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local.nelements), "GROUP_RANK": str(group_rank), "GROUP_WORLD_SIZE": str(groups)}
