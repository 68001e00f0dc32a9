"""Calls to actors whose proc has died fail promptly instead of waiting forever.

The host agent sees its child exit at once and tells the hub, which tells every
client which actor addresses died and why. Here, every call still waiting on one of
those actors gets a failure reply for that rank (sent to this process's own mailbox,
so it is dispatched like any reply), and later calls to them fail without being sent.
The call then raises :class:`SupervisionError` naming mesh, rank, host, pid and cause.
"""

from __future__ import annotations

import threading

from ..errors import SupervisionError
from ..wire import frames as wire_frames
from ..wire.mailbox import local_mailbox
from ..wire.remote_error import pack_exception

_lock = threading.Lock()
_dead: dict[str, str] = {}  # actor address -> why it is gone
_waiting: dict[str, dict[int, tuple[str, int]]] = {}  # actor address -> port -> (cluster id, base rank)


def watch(cluster_id: str, port: int, targets: dict[str, int]) -> dict[str, str]:
    """Note that ``port`` waits on the actors at ``targets`` (address -> base rank);
    returns those already known dead (address -> why), which must not be called."""
    with _lock:
        for address in targets:
            _waiting.setdefault(address, {})[port] = (cluster_id, targets[address])
        return {a: _dead[a] for a in targets if a in _dead}


def unwatch(port: int, addresses) -> None:
    with _lock:
        for address in addresses:
            ports = _waiting.get(address)
            if ports is not None:
                ports.pop(port, None)
                if not ports:
                    del _waiting[address]


def revive(addresses) -> None:
    """New actors listen at ``addresses``: a dead actor's port may have been reused."""
    with _lock:
        for address in addresses:
            _dead.pop(address, None)


def mark_dead(address: str, why: str) -> None:
    """The actor at ``address`` is known gone (its proc exited before we looked)."""
    with _lock:
        _dead[address] = why


def fail(cluster_id: str, port: int, base_rank: int, why: str) -> None:
    """Send the waiting call at ``port`` a failure reply for ``base_rank``."""
    mailbox = local_mailbox()
    header = {"port": port, "rank": base_rank, "ok": False}
    mailbox.send(mailbox.address, wire_frames.encode_value(cluster_id, header,
                                                             pack_exception(SupervisionError(why))))


def proc_failed(event: dict) -> None:
    """The hub's news that a proc died: fail what waits on its actors."""
    why = event["why"]
    with _lock:
        pending = []
        for address, (mesh, rank) in event["actors"].items():
            _dead[address] = f"{mesh} rank {rank}: {why}"
            pending += [(port, cid, base, _dead[address]) for port, (cid, base) in _waiting.pop(address, {}).items()]
    for port, cluster_id, base_rank, reason in pending:
        fail(cluster_id, port, base_rank, reason)
