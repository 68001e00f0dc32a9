"""asyncio flavour of the socket helpers, for the hub and host agents.

Both are single-threaded asyncio daemons: one PULL inbox, PUSH sockets per peer,
and a table of ports for replies to the requests they send.

Sending never blocks the event loop: a peer that is stopped or not reading (a client
under SIGSTOP) gets an unbounded queue rather than a hub that waits on it. Sockets to
peers known gone (``forget``) are closed at once, and those unused for
``sockets.IDLE_SOCKET_S`` at the next send after that: a long-running hub that
spawns and stops thousands of procs keeps a flat number of file descriptors, and
libzmq does not keep reconnecting to addresses nobody listens on.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from typing import Any, Coroutine

import zmq
import zmq.asyncio

from ..protocol import envelope
from . import frames as wire_frames
from . import shm, sockets, stream, zap


class AioEndpoint:
    """Inbox, outbox and reply ports of an asyncio daemon."""

    def __init__(self, cluster_id: str, prefer: str | None = None):
        self.cluster_id = cluster_id
        self.ctx = sockets.sized(zmq.asyncio.Context())
        self.inbox, self.address = sockets.bind_inbox(self.ctx, prefer)
        self.guard = wire_frames.ReplayGuard()
        self._drained_at = time.monotonic()  # when recv last found the inbox empty
        self._idle = False  # recv is waiting on an empty inbox
        self._out: dict[str, zmq.asyncio.Socket] = {}
        self._used: dict[str, float] = {}  # address -> when last sent to (monotonic)
        self._next_sweep = time.monotonic() + sockets.IDLE_SOCKET_S
        self._pending: dict[int, asyncio.Future] = {}
        self._ports = itertools.count(sockets.first_reply_port())
        self.refused_sends = 0  # messages whose peer refused the handshake (see send)

    async def recv(self) -> wire_frames.Message:
        """Next verified message; bad frame sets are dropped (and counted)."""
        while True:
            try:
                frames = await self.inbox.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self._drained_at = time.monotonic()
                self._idle = True
                try:
                    streams = self.guard.streams
                    while streams:  # half-received: time spent waiting for nothing counts (wire.stream)
                        started = time.monotonic()
                        if await self.inbox.poll(int(stream.IDLE_CHECK_S * 1000)):
                            break
                        streams.idle(time.monotonic() - started)
                    frames = await self.inbox.recv_multipart(copy=False)
                finally:
                    self._idle = False
            try:
                return wire_frames.decode(frames, self.guard)
            except wire_frames.BadMessage:
                continue

    def caught_up(self) -> float:
        """Up to when (monotonic seconds) everything sent to this endpoint has been
        read: now while ``recv`` waits on an empty inbox, else when it last found it
        empty. A liveness check counts a peer's silence only up to then, so that a
        backlog of this daemon's own is not blamed on its peers."""
        return time.monotonic() if self._idle else self._drained_at

    def deliver_reply(self, message: wire_frames.Message) -> bool:
        """Route a reply to the request waiting for it; False if it is not a reply."""
        port = message.header.get(envelope.PORT)
        future = self._pending.get(port) if isinstance(port, int) else None
        if future is None or envelope.OP in message.header:
            return False
        if not future.done():
            future.set_result(message)
        return True

    async def send(self, address: str, header: dict, body: Any = None, buffers=()) -> None:
        """Queue a message for ``address`` (never waits for the peer)."""
        now = time.monotonic()
        sock = self._out.get(address)
        if sock is None:
            sock = self._out[address] = self.ctx.socket(zmq.PUSH)
            zap.present(sock, self.cluster_id)
            sock.setsockopt(zmq.LINGER, sockets.SEND_LINGER_MS)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.SNDTIMEO, 0)  # (a send waits only after a refused handshake: sockets.Outbox)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, sockets.RECONNECT_IVL_MAX_MS)
            sock.connect(address)
        self._used[address] = now
        if now > self._next_sweep:
            self._sweep(now)
        frames = wire_frames.encode(self.cluster_id, header, body, buffers)
        try:
            if wire_frames.needs_route(frames):  # (a large spawn payload, a long log reply)
                # The chunks go first on the same socket, sent at once: with no high-water mark a
                # send never waits, and each chunk's frame keeps its buffer alive until it left.
                sync: zmq.Socket = zmq.Socket.shadow(sock.underlying)
                frames = wire_frames.route(address, frames, functools.partial(stream.send, sync, []))
                await sock.send_multipart(frames, copy=False)
            else:
                await sock.send(wire_frames.pack(frames))  # one send, not three
        except zmq.Again:
            # The process at ``address`` refused this cluster's credentials (wire.zap): not
            # ours, so whoever was ours there is gone. Lost as to a gone peer, and counted.
            self.refused_sends += 1
            self.forget(address)

    def _sweep(self, now: float) -> None:
        """Close sockets unused for ``IDLE_SOCKET_S`` (after they deliver what they hold)."""
        self._next_sweep = now + sockets.IDLE_SOCKET_S
        for address in [a for a, t in self._used.items() if now - t > sockets.IDLE_SOCKET_S]:
            self._used.pop(address)
            self._out.pop(address).close()

    def forget(self, address: str) -> None:
        """The peer at ``address`` is gone (a proc that exited, a client that left):
        close the socket to it now, dropping what it still queues (a proc restarted
        at the same address must not get it)."""
        self._used.pop(address, None)
        sock = self._out.pop(address, None)
        if sock is not None:
            sock.close(0)
        shm.unlink_sent(address)

    def open_sockets(self) -> int:
        """How many sending sockets are open (one per peer recently sent to)."""
        return len(self._out)

    async def request(self, address: str, header: dict, body: Any = None, buffers=(),
                      timeout: float | None = None) -> wire_frames.Message:
        """Send ``header`` with a reply port and await the reply (``asyncio.TimeoutError``)."""
        port, reply = self.expect(timeout)
        try:
            await self.send(address, {**header, envelope.PORT: port, envelope.REPLY: self.address}, body, buffers)
        except BaseException:
            reply.close()
            self._pending.pop(port, None)
            raise
        return await reply

    def expect(self, timeout: float | None = None) -> tuple[int, Coroutine[Any, Any, wire_frames.Message]]:
        """A reply port of this endpoint (to put in a request, maybe one sent by someone
        else), and a coroutine that awaits the one reply sent to it (``asyncio.TimeoutError``
        after ``timeout`` seconds). Await the coroutine, or ``close()`` it and ``forget_port``."""
        port = next(self._ports)
        future = self._pending[port] = asyncio.get_running_loop().create_future()
        return port, self._answer(port, future, timeout)

    def forget_port(self, port: int) -> None:
        self._pending.pop(port, None)

    async def _answer(self, port: int, future: asyncio.Future, timeout: float | None) -> wire_frames.Message:
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._pending.pop(port, None)

    async def reply(self, request: dict, **fields) -> None:
        """Answer a request message's header (no-op if it asked for no reply, or gave
        no address to reply to)."""
        if envelope.PORT in request and isinstance(request.get(envelope.REPLY), str):
            await self.send(request[envelope.REPLY], {envelope.PORT: request[envelope.PORT], **fields})

    def close(self) -> None:
        for sock in self._out.values():
            sock.close()  # lingers: the last replies (e.g. to "shutdown") still go out
        self.inbox.close(0)
        self.ctx.term()
