"""zmq sockets the way monarch_nb uses them.

Every participant (client, proc actor, hub, host agent) receives on PULL sockets it
binds on loopback (or the interface an allocator names) and sends through PUSH
sockets connected to the peer's address, cached per thread (zmq sockets must not be
shared between threads). The reply address travels in each message's header.
"""

from __future__ import annotations

import os
import threading
import time

import zmq

from ..errors import ClusterError
from . import frames as wire_frames
from .interrupts import protected

# How long a closed sending socket keeps trying to deliver what it has queued (ms).
# Not 0: a thread that sends a reply and then exits (an actor whose __init__ failed,
# a stopped actor) closes its socket at once, and the reply must still go out.
SEND_LINGER_MS = 2000

_SNDMORE = int(zmq.SNDMORE)

# Sending sockets to peers that are gone (a client whose kernel restarted) must not
# pile up: libzmq retries each every 100 ms by default. Back off to 1 s, and close a
# thread's socket once it has gone unused this long (seconds).
RECONNECT_IVL_MAX_MS = 1000
IDLE_SOCKET_S = 60.0

# How long a sender waits for a message that holds large buffers to leave the
# process before the buffers may be reused (seconds).
SEND_DRAIN_TIMEOUT_S = 60.0


def bind_host() -> str:
    """Interface to bind on: ``MONARCH_NB_BIND`` or loopback."""
    return os.environ.get("MONARCH_NB_BIND", "127.0.0.1")


def context() -> zmq.Context:
    """This process's zmq context (re-created after fork)."""
    return zmq.Context.instance()


def bind_inbox(ctx: zmq.Context | None = None, prefer: str | None = None) -> tuple[zmq.Socket, str]:
    """A PULL socket bound on a free port of :func:`bind_host`; returns ``(socket, address)``.

    ``prefer``: an address to take if it is free (a restarted hub takes its
    predecessor's), else a random port is used."""
    ctx = ctx or context()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    # Oversized frames close the connection in libzmq instead of being buffered.
    sock.setsockopt(zmq.MAXMSGSIZE, wire_frames.max_message_bytes())
    if prefer is not None:
        try:
            sock.bind(prefer)
            return sock, prefer
        except zmq.ZMQError:
            pass
    host = bind_host()
    port = sock.bind_to_random_port(f"tcp://{host}")
    return sock, f"tcp://{host}:{port}"


def recv_frames(sock: zmq.Socket, flags: int = 0) -> list:
    """Receive one frame set; large frames stay zero-copy ``zmq.Frame`` objects."""
    return sock.recv_multipart(flags, copy=False)


# Bumped when an address's peer is known dead: every thread's socket to it is then
# closed before its next use, dropping what it still queues (see Outbox.discard).
_generations: dict[str, int] = {}


class Outbox:
    """Per-thread PUSH sockets, one per destination address; those unused for
    ``IDLE_SOCKET_S`` seconds are closed (after delivering what they hold)."""

    def __init__(self, ctx: zmq.Context | None = None):
        self._ctx = ctx
        self._local = threading.local()

    def _socket(self, address: str) -> zmq.Socket:
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.sockets, local.used, local.generations, local.pid = {}, {}, {}, os.getpid()
            local.next_sweep = time.monotonic() + IDLE_SOCKET_S
        now = time.monotonic()
        local.used[address] = now
        sock = local.sockets.get(address)
        generation = _generations.get(address, 0)
        if sock is not None and local.generations.get(address, 0) != generation:
            sock.close(0)  # queued for a dead peer: must not reach whoever binds the address next
            sock = None
        if sock is None:
            sock = (self._ctx or context()).socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, SEND_LINGER_MS)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
            sock.connect(address)
            local.sockets[address] = sock
            local.generations[address] = generation
        if now > local.next_sweep:
            local.next_sweep = now + IDLE_SOCKET_S
            for idle in [a for a, t in local.used.items() if now - t > IDLE_SOCKET_S]:
                local.used.pop(idle)
                local.sockets.pop(idle).close()
        return sock

    @protected
    def send(self, address: str, frames: list) -> None:
        """Send ``frames`` to ``address``, whole: never interrupted between two frames
        (``wire.interrupts``); a send that fails half way closes its socket, so that
        the torn message is never completed by the next one. When the message carries
        large buffers, wait until they have left this process so the caller may reuse
        them.

        Raises :class:`ClusterError` when they can't leave within
        ``SEND_DRAIN_TIMEOUT_S`` (the peer is gone or not reading)."""
        sock = self._socket(address)
        buffers = frames[wire_frames.FIXED_FRAMES:]
        try:
            if sum(memoryview(f).nbytes for f in buffers) < zmq.COPY_THRESHOLD:
                # send_multipart's per-frame enum arithmetic costs more than a small send.
                for frame in frames[:-1]:
                    sock.send(frame, _SNDMORE)
                sock.send(frames[-1])
                return
            tracker = sock.send_multipart(frames, copy=False, track=True)
        except BaseException:
            self.forget(address)
            raise
        try:
            tracker.wait(SEND_DRAIN_TIMEOUT_S)
        except zmq.NotDone:
            self.forget(address)
            raise ClusterError(
                f"could not deliver a message to {address} within {SEND_DRAIN_TIMEOUT_S} s; "
                "the receiving process is gone or not reading"
            ) from None

    @staticmethod
    def discard(address: str) -> None:
        """The peer at ``address`` is dead: messages still queued for it, in any thread,
        are dropped (an actor restarted at the same address must not get them)."""
        _generations[address] = _generations.get(address, 0) + 1

    def drop_discarded(self) -> None:
        """Close now this thread's sockets to discarded peers (before a restart binds
        their addresses again; other threads close theirs at their next send)."""
        local = self._local
        for address, sock in list(getattr(local, "sockets", {}).items()):
            if local.generations.get(address, 0) != _generations.get(address, 0):
                local.sockets.pop(address).close(0)
                local.used.pop(address, None)

    def close_thread_sockets(self) -> None:
        """Close this thread's sockets, delivering what they hold (a thread about to end)."""
        local = self._local
        for sock in getattr(local, "sockets", {}).values():
            sock.close()
        local.sockets, local.used, local.generations = {}, {}, {}

    def forget(self, address: str) -> None:
        """Close this thread's socket to ``address`` (dropping anything queued)."""
        getattr(self._local, "used", {}).pop(address, None)
        sock = getattr(self._local, "sockets", {}).pop(address, None)
        if sock is not None:
            sock.close(0)
