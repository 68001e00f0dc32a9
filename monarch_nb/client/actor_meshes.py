"""Finding an actor mesh of a cluster by name.

Actor mesh names are scoped to their proc mesh (as in Monarch): ``"counter"`` may live
on two proc meshes. The hub keys them ``PROC_MESH/NAME``; a person usually types the
bare name. :func:`resolve` accepts both, and :class:`ActorMeshes` is the mapping
``Cluster.actor_meshes`` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

V = TypeVar("V")


def resolve(keys: Iterable[str], name: str) -> str | None:
    """The key among ``keys`` that ``name`` means: ``name`` itself when it is a key,
    else the only key ending in ``/name``; ``None`` when none does. Raises
    ``KeyError`` naming the keys when several proc meshes have a mesh ``name``."""
    keys = list(keys)
    if name in keys:
        return name
    matches = sorted(k for k in keys if k.rpartition("/")[2] == name)
    if len(matches) > 1:
        raise KeyError(f"several proc meshes have an actor mesh named {name!r}; use one of "
                       f"{', '.join(repr(k) for k in matches)}")
    return matches[0] if matches else None


class ActorMeshes(dict[str, V]):
    """Actor meshes by key (``"procs/counter"``), also found by their bare name
    (``"counter"``) when only one proc mesh has it; an ambiguous bare name raises
    ``KeyError`` naming the keys. Iterating gives the keys. ``picked(key)``, when given,
    is told of each mesh looked up (``[name]``, ``get``) before it is returned."""

    def __init__(self, meshes: dict[str, V], picked: Callable[[str], None] | None = None):
        super().__init__(meshes)
        self._picked = picked

    def __getitem__(self, name: str) -> V:
        key = name if dict.__contains__(self, name) else self._resolve(name)
        if self._picked is not None:
            self._picked(key)
        return dict.__getitem__(self, key)

    def _resolve(self, name: str) -> str:
        key = resolve(self.keys(), name) if isinstance(name, str) else None
        if key is None:
            raise KeyError(f"no actor mesh {name!r} (actor meshes: {', '.join(sorted(self)) or 'none'})")
        return key

    def __contains__(self, name) -> bool:
        if dict.__contains__(self, name):
            return True
        try:
            return isinstance(name, str) and resolve(self.keys(), name) is not None
        except KeyError:  # ambiguous: there are some
            return True

    def get(self, name, default=None):
        try:
            return self[name]
        except KeyError:
            if name in self:  # ambiguous: say so rather than answer None
                raise
            return default
