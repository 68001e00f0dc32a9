"""asyncio flavour of the socket helpers, for the hub and host agents.

Both are single-threaded asyncio daemons: one PULL inbox, PUSH sockets per peer,
and a table of ports for replies to the requests they send.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import zmq
import zmq.asyncio

from . import frames as wire_frames
from . import sockets


class AioEndpoint:
    """Inbox, outbox and reply ports of an asyncio daemon."""

    def __init__(self, cluster_id: str, prefer: str | None = None):
        self.cluster_id = cluster_id
        self.ctx = zmq.asyncio.Context()
        self.inbox, self.address = sockets.bind_inbox(self.ctx, prefer)
        self.guard = wire_frames.ReplayGuard()
        self._out: dict[str, zmq.asyncio.Socket] = {}
        self._pending: dict[int, asyncio.Future] = {}
        self._ports = itertools.count(1)

    async def recv(self) -> wire_frames.Message:
        """Next verified message; bad frame sets are dropped (and counted)."""
        while True:
            frames = await self.inbox.recv_multipart(copy=False)
            try:
                return wire_frames.decode(frames, self.guard)
            except wire_frames.BadMessage:
                continue

    def deliver_reply(self, message: wire_frames.Message) -> bool:
        """Route a reply to the request waiting for it; False if it is not a reply."""
        future = self._pending.get(message.header.get("port"))
        if future is None or "op" in message.header:
            return False
        if not future.done():
            future.set_result(message)
        return True

    async def send(self, address: str, header: dict, body: Any = None, buffers=()) -> None:
        sock = self._out.get(address)
        if sock is None:
            sock = self._out[address] = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, sockets.SEND_LINGER_MS)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, sockets.RECONNECT_IVL_MAX_MS)
            sock.connect(address)
        await sock.send_multipart(wire_frames.encode(self.cluster_id, header, body, buffers), copy=False)

    async def request(self, address: str, header: dict, body: Any = None, buffers=(),
                      timeout: float | None = None) -> wire_frames.Message:
        """Send ``header`` with a reply port and await the reply (``asyncio.TimeoutError``)."""
        port = next(self._ports)
        future = self._pending[port] = asyncio.get_running_loop().create_future()
        try:
            await self.send(address, {**header, "port": port, "reply": self.address}, body, buffers)
            return await asyncio.wait_for(future, timeout)
        finally:
            self._pending.pop(port, None)

    async def reply(self, request: dict, **fields) -> None:
        """Answer a request message's header (no-op if it asked for no reply)."""
        if "port" in request:
            await self.send(request["reply"], {"port": request["port"], **fields})

    def close(self) -> None:
        for sock in self._out.values():
            sock.close()  # lingers: the last replies (e.g. to "shutdown") still go out
        self.inbox.close(0)
        self.ctx.term()
