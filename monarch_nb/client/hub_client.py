"""Blocking control requests from a client (or an actor) to the hub."""

from __future__ import annotations

from typing import Callable

from ..errors import ClusterError, HubTimeout, InvalidRequest
from .runtime import runtime

# The hub names the kind of error; the client raises the matching type.
_ERROR_TYPES = {"ValueError": InvalidRequest, "ClusterError": ClusterError}

# hub address -> a function that raises ClusterError once that hub is known dead
_liveness: dict[str, Callable[[], None]] = {}


def watch_hub(address: str, check: Callable[[], None]) -> None:
    """Make requests to the hub at ``address`` give up early when ``check`` raises."""
    _liveness[address] = check


class HubClient:
    """Sends one request at a time per call and waits for the hub's reply."""

    def __init__(self, cluster_id: str, address: str):
        self.cluster_id = cluster_id
        self.address = address

    def request(self, op: str, body: bytes | None = None, buffers=(), timeout: float | None = 120.0,
                while_waiting: Callable[[], None] | None = None, **fields) -> dict:
        """Run ``op`` on the hub; returns the reply header.

        The reply header's routing fields (``port``, ``ok``) are removed.
        Raises :class:`InvalidRequest` (a ``ValueError``) for a request the hub refused
        as bad input, :class:`ClusterError` when the hub failed or died (known within
        about a second for a hub on this machine), :class:`HubTimeout` (a
        ``ClusterError`` and ``TimeoutError``) when it did not answer within ``timeout``
        seconds (``None``: no limit). ``while_waiting`` runs about twice a second until
        the reply comes (progress)."""
        alive = _liveness.get(self.address)

        def check() -> None:
            if alive is not None:
                alive()
            if while_waiting is not None:
                while_waiting()

        reply = runtime().mailbox.request(self.address, self.cluster_id, {"op": op, **fields}, body,
                                        buffers, timeout, check=check)
        if reply is None:
            raise HubTimeout(f"the hub at {self.address} did not answer {op!r} within {timeout} s; "
                               "is the cluster still running?")
        header = reply.header
        if not header.get("ok"):
            raise _ERROR_TYPES.get(header.get("error_type"), ClusterError)(header["error"])
        return {k: v for k, v in header.items() if k not in ("port", "ok")}
