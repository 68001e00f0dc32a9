"""Blocking control requests from a client (or an actor) to the hub."""

from __future__ import annotations

from ..errors import ClusterError, InvalidRequest
from ..wire import frames as wire_frames
from ..wire.mailbox import local_mailbox

_ERROR_TYPES = {"ValueError": ValueError, "TypeError": TypeError, "ClusterError": ClusterError}


class HubClient:
    """Sends one request at a time per call and waits for the hub's reply."""

    def __init__(self, cluster_id: str, address: str):
        self.cluster_id = cluster_id
        self.address = address

    def request(self, op: str, body: bytes | None = None, buffers=(), timeout: float | None = 120.0,
                **fields) -> dict:
        """Run ``op`` on the hub; returns the reply header.

        Raises ``ValueError``/``TypeError`` for a request the hub refused as bad input,
        :class:`ClusterError` when the hub failed or did not answer within ``timeout``
        seconds."""
        mailbox = local_mailbox()
        replies: list[wire_frames.Message] = []
        port = mailbox.open_port(replies.append)
        try:
            header = {"op": op, "port": port, "reply": mailbox.address, **fields}
            mailbox.send(self.address, wire_frames.encode(self.cluster_id, header, body, buffers))
            if not mailbox.wait(lambda: bool(replies), timeout):
                raise ClusterError(f"the hub at {self.address} did not answer {op!r} within {timeout} s; "
                                   "is the cluster still running?")
        finally:
            mailbox.close_port(port)
        reply = replies[0].header
        if not reply.get("ok"):
            error_type = _ERROR_TYPES.get(reply.get("error_type"), ClusterError)
            if error_type is ValueError:
                raise InvalidRequest(reply["error"])
            raise error_type(reply["error"])
        return reply
