"""The health tree's deltas: what the hub pushes to a subscriber (``events.HEALTH_DELTA``)
so that its copy of the tree becomes the hub's, carrying only what changed.

A tree is JSON-like: dicts, lists, strings, numbers. A delta says, for a dict, which keys
changed (each with a sub-delta), which were removed; for a list whose items are nodes
with an identity (``host_id``, ``proc_id``, ``key``, a mesh and rank...), which nodes
changed and the new order of identities when it changed (nodes not in it are gone); any
other value is replaced whole. ``diff(old, new)`` makes one, ``apply(tree, delta)`` plays
it: ``apply(copy_of(old), diff(old, new)) == new``.

``volatile`` keys (figures that change on every heartbeat: memory, CPU, uptime, how long
an actor has been busy) can be left out of a delta: a subscriber that asked for them
every few seconds is not sent a delta each heartbeat for them alone.
"""

from __future__ import annotations

from typing import Any, Callable

from .gpus import GPU_USED_BYTES

# Delta fields (short: a delta is sent each time something changes).
SET = "s"  # a replaced value
KEYS = "d"  # dict: key -> sub-delta of the keys that changed or appeared
DROP = "x"  # dict: the keys removed
ITEMS = "i"  # list of nodes: identity -> sub-delta of the nodes that changed or appeared
ORDER = "o"  # list of nodes: the identities in their new order (only when it changed)

# Figures a delta may leave out until the subscriber's next refresh of them.
VOLATILE = frozenset({"rss_bytes", "cpu_s", "uptime_s", "busy_s", "paused_s", "hub", GPU_USED_BYTES})

_MISSING = object()


def identity(node: Any) -> str | None:
    """The identity of a node in a list of the tree, or ``None`` for a plain value."""
    if not isinstance(node, dict):
        return None
    for key in ("proc_id", "host_id", "key", "replica", "proc_mesh"):
        if key in node and not isinstance(node[key], (dict, list)):
            return f"{key}={node[key]}"
    if "mesh" in node and "rank" in node:  # an actor
        return f"{node['mesh']}/{node['rank']}"
    return None


def _ids(items: list) -> list[str | None]:
    return [identity(item) for item in items]


def diff(old: Any, new: Any, skip: Callable[[str], bool] | None = None) -> dict | None:
    """The delta that turns ``old`` into ``new``, ``None`` when they are equal. Keys for
    which ``skip(key)`` is true (``skip``: optional) are left as they are in ``old`` (a
    key new in ``new`` is always sent)."""
    if old is _MISSING or type(old) is not type(new) and not (isinstance(old, str) and isinstance(new, str)):
        return {SET: new}
    if isinstance(new, dict):
        keys = {}
        for key, value in new.items():
            before = old.get(key, _MISSING)
            if before is not _MISSING and skip is not None and skip(key):
                continue
            sub = diff(before, value, skip)
            if sub is not None:
                keys[key] = sub
        dropped = [key for key in old if key not in new]
        if not keys and not dropped:
            return None
        delta: dict = {}
        if keys:
            delta[KEYS] = keys
        if dropped:
            delta[DROP] = dropped
        return delta
    if isinstance(new, list):
        new_ids, old_ids = _ids(new), _ids(old)
        if None in new_ids or None in old_ids or len(set(new_ids)) != len(new_ids) or len(set(old_ids)) != len(old_ids):
            return None if old == new else {SET: new}
        before = dict(zip(old_ids, old))
        items = {}
        for node_id, node in zip(new_ids, new):
            sub = diff(before.get(node_id, _MISSING), node, skip)
            if sub is not None:
                items[node_id] = sub
        delta = {}
        if items:
            delta[ITEMS] = items
        if new_ids != old_ids:
            delta[ORDER] = new_ids
        return delta or None
    return None if old == new else {SET: new}


def apply(tree: Any, delta: dict | None) -> Any:
    """``tree`` changed by ``delta`` (dicts and lists changed in place where they
    stay); returns the result."""
    if delta is None:
        return tree
    if SET in delta:
        return delta[SET]
    if isinstance(tree, dict):
        for key in delta.get(DROP, ()):
            tree.pop(key, None)
        for key, sub in delta.get(KEYS, {}).items():
            tree[key] = apply(tree.get(key, _MISSING), sub)
        return tree
    if isinstance(tree, list):
        by_id = dict(zip(_ids(tree), tree))
        for node_id, sub in delta.get(ITEMS, {}).items():
            by_id[node_id] = apply(by_id.get(node_id, _MISSING), sub)
        order = delta.get(ORDER)
        if order is None:
            order = [identity(node) for node in tree]
        tree[:] = [by_id[node_id] for node_id in order]
        return tree
    raise ValueError(f"a health delta {sorted(delta)} does not fit a {type(tree).__name__}: ask for the whole tree")
