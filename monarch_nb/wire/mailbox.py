"""A process's mailbox: one inbox for replies, routed to ports.

A caller opens a *port* (a callback), sends requests naming ``(address, port)`` as
the reply-to, and waits. Waiting drives the I/O itself: the first waiting thread
takes the inbox and dispatches every arriving message to its port while the others
sleep on a waiter lock of their own, so a blocking ``get()`` costs no thread hand-off.
A pump thread takes over only while something waits asynchronously (``await`` on an
asyncio loop, done-callbacks). Both run the same dispatch code.

Ctrl-C lands only in the blocking poll or sleep of a wait (see ``wire.interrupts``):
never between the frames of a send, inside the dispatch of a reply or in the middle of
the lock bookkeeping, so an interrupted wait leaves the mailbox as it was.
"""

from __future__ import annotations

import _thread
import functools
import itertools
import threading
import time
import traceback
from typing import Callable, Hashable, Iterable

import zmq

from ..protocol import envelope, router_ops
from . import frames as wire_frames
from . import sockets
from .interrupts import checkpoint, guard_main_thread, protected, sleep_on

_EVENTS, _POLLIN, _NOBLOCK = sockets.EVENTS, sockets.POLLIN, sockets.NOBLOCK  # (plain ints: see there)
_CHUNK_S = 0.05  # how long one holder of the inbox polls before re-checking
CHECK_S = 0.5  # how often a request's ``check`` runs while it waits


class Mailbox:
    """Inbox plus outbox of one process (the client runtime owns it: one per process)."""

    def __init__(self):
        self.outbox = sockets.Outbox()
        self._inbox, self.address = sockets.bind_inbox()
        self.guard = wire_frames.ReplayGuard()
        self._ports: dict[int, Callable[[wire_frames.Message], None]] = {}
        self._next_port = itertools.count(sockets.first_reply_port())
        # Whether a thread drives the inbox, and the lock taken to claim it. Not a try-lock
        # held while driving: see wait().
        self._driven = False
        self._driver: int | None = None  # the thread that drives it (threading.get_ident)
        self._claim = threading.Lock()
        self._sleepers: set = set()  # one lock per sleeping thread, released to wake it (interrupts.sleep_on)
        self._async_lock = threading.Lock()
        self._async_waiters = 0
        self._pump_wanted = threading.Event()
        self._pump: threading.Thread | None = None

    # ports -----------------------------------------------------------------------
    @protected
    def open_port(self, callback: Callable[[wire_frames.Message], None]) -> int:
        """Register ``callback`` for replies; it runs on the dispatching thread and
        must be quick. Returns the port number to put in requests."""
        port = next(self._next_port)
        self._ports[port] = callback
        return port

    def close_port(self, port: int) -> None:
        self._ports.pop(port, None)

    def send(self, address: str, frames: list) -> None:
        guard_main_thread()  # a script's first act may be a broadcast: no wait has guarded it yet
        self.outbox.send(address, frames)

    def send_to_each(self, addresses: Iterable[str], frames: list) -> None:
        guard_main_thread()
        self.outbox.send_to_each(addresses, frames)

    def request(self, address: str, cluster_id: str, header: dict, body: bytes | None = None,
                buffers=(), timeout: float | None = None,
                check: Callable[[], None] | None = None) -> wire_frames.Message | None:
        """Send ``header`` (plus a pickled ``body``) with this mailbox as reply-to and wait
        for the one reply; ``None`` when none came within ``timeout`` seconds.
        ``check`` runs every ``CHECK_S`` seconds while waiting and may raise to give up
        (e.g. when the peer is known dead). A KeyboardInterrupt ends the wait (the
        request was sent whole; its late reply is dropped)."""
        with Gather(self) as gather:
            gather.request(address, cluster_id, header, body, buffers)
            gather.wait(1, timeout, check)
            return gather.replies.get(None)

    # waiting ---------------------------------------------------------------------
    @protected
    def wait(self, done: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block until ``done()`` is true or ``timeout`` seconds pass; returns ``done()``.

        Interruptible by KeyboardInterrupt, which leaves the mailbox consistent (the
        port stays open, so a late reply is still routed)."""
        guard_main_thread()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            # Under a SIGINT handler of the user's own, KeyboardInterrupt lands at any
            # instant the interpreter checks for signals: after any call returns, a try-
            # lock's included, before its caller could note that it holds the lock (that
            # left the inbox claimed forever: every later wait of the process timed out).
            # So the claim is a flag set and cleared where no such check comes between:
            # inside a ``with`` of a lock (entered and left in C), by plain assignments,
            # in a ``try`` whose ``finally`` clears it without calling anything first.
            mine = False
            try:
                with self._claim:
                    if not self._driven:
                        self._driven = mine = True
                        self._driver = threading.get_ident()
                if mine:
                    self._drive(done, deadline)
                elif self._driver == threading.get_ident():
                    # A wait inside a message's dispatch (a done-callback that makes a
                    # request): this thread drives the inbox already, and sleeping until
                    # the driver dispatches the reply would wait on itself until the
                    # timeout. It drives it here, nested; the outer wait goes on after.
                    self._drive(done, deadline)
                else:
                    self._sleep(done, _CHUNK_S if remaining is None else min(remaining, _CHUNK_S))
            finally:
                if mine:
                    self._driver = None
                    self._driven = False
                    self._wake_sleepers()  # one of them takes over the inbox
        return True

    def _sleep(self, done: Callable[[], bool], seconds: float) -> None:
        waiter = _thread.allocate_lock()
        waiter.acquire()
        self._sleepers.add(waiter)
        try:
            if not done() and self._driven:
                sleep_on(waiter, seconds)
        finally:
            self._sleepers.discard(waiter)

    def _wake_sleepers(self) -> None:
        for waiter in list(self._sleepers):
            try:
                waiter.release()
            except RuntimeError:  # already woken
                pass

    def _drive(self, done: Callable[[], bool], deadline: float | None) -> None:
        inbox = self._inbox
        while not done():
            if deadline is None:
                poll_ms = int(_CHUNK_S * 1000)
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                poll_ms = max(1, min(int(remaining * 1000), int(_CHUNK_S * 1000)))
            streams = self.guard.streams
            if streams:  # half-received: time spent waiting for nothing counts toward dropping them
                started = time.monotonic()
                if not _poll(inbox, poll_ms):
                    streams.idle(time.monotonic() - started)
                    continue
            elif not _poll(inbox, poll_ms):
                continue
            # Drain what is queued while this wait is not over (checking EVENTS is cheaper
            # than a failing recv); a wait for one reply asks no EVENTS at all. What stays
            # queued is found by the next poll, of whichever thread waits next.
            while True:
                self._dispatch(sockets.recv_frames(inbox, _NOBLOCK))
                if done() or not inbox.getsockopt(_EVENTS) & _POLLIN:
                    break

    def _dispatch(self, frames: list) -> None:
        try:
            message = wire_frames.decode(frames, self.guard)
        except wire_frames.BadMessage:
            return
        if router_ops.BATCH in message.header:  # replies a host's router batched (host.router)
            self._dispatch_batch(message)
            return
        self._deliver(message)

    def _dispatch_batch(self, message: wire_frames.Message) -> None:
        """Each reply of a router's batch to its port, in the order they came; the batch
        was verified whole (the router checked each reply's signature as it arrived)."""
        header = message.header
        view = memoryview(message.body if message.body is not None else b"")
        at = 0
        try:
            for sub, length in zip(header[router_ops.BATCH], header[router_ops.LENGTHS]):
                self._deliver(wire_frames.Message(sub, view[at:at + length] if length else None), wake=False)
                at += length
        finally:
            self._wake_sleepers()  # once for the batch: a reply costs the client ~10 us in all

    def _deliver(self, message: wire_frames.Message, wake: bool = True) -> None:
        callback = self._ports.get(message.header.get(envelope.PORT))
        if callback is not None:
            try:
                callback(message)
            except KeyboardInterrupt:
                # This client's own Ctrl-C, landed under a SIGINT handler of the user's
                # own (the runtime's defers it): the waiting caller gets it, as the user
                # asked; swallowed here, the wait it ended went on until its timeout.
                self._wake_sleepers()
                raise
            except BaseException:  # noqa: BLE001 - a broken callback must not take the dispatching thread down
                traceback.print_exc()
        if wake:
            self._wake_sleepers()

    # asynchronous waiting ---------------------------------------------------------
    def async_waiter(self) -> "_AsyncWaiter":
        """Context manager marking an asynchronous waiter; keeps the pump running."""
        return _AsyncWaiter(self)

    def _pump_loop(self) -> None:
        while True:
            self._pump_wanted.wait()
            try:
                self.wait(lambda: self._async_waiters == 0, timeout=_CHUNK_S)
            except BaseException:  # noqa: BLE001 - every later await in this process needs the pump
                traceback.print_exc()
            if self._async_waiters == 0:
                self._pump_wanted.clear()
                if self._async_waiters:  # raced with a new waiter
                    self._pump_wanted.set()


@checkpoint
def _poll(inbox: zmq.Socket, timeout_ms: int) -> bool:
    # zmq_poll itself: Socket.poll builds a Poller (three Python calls) for every wait.
    return bool(zmq.zmq_poll([(inbox, _POLLIN)], timeout_ms))


class _AsyncWaiter:
    def __init__(self, mailbox: Mailbox):
        self._mailbox = mailbox

    @protected
    def __enter__(self):
        mb = self._mailbox
        with mb._async_lock:
            mb._async_waiters += 1
            if mb._pump is None:
                mb._pump = threading.Thread(target=mb._pump_loop, name="monarch-nb-pump", daemon=True)
                mb._pump.start()
        mb._pump_wanted.set()
        return self

    @protected
    def __exit__(self, *exc):
        mb = self._mailbox
        with mb._async_lock:
            mb._async_waiters -= 1


class Gather:
    """Scatter/gather: requests sent to many destinations, the replies collected per
    destination. Every fan-out of a client goes through here (endpoint calls, control
    requests to procs, debugger actions, a single request).

    Each :meth:`open` makes a reply port for one *key* (a rank, a request number).
    Without ``on_reply``, the first reply to each port is kept in ``replies[key]`` and
    :meth:`wait` waits for them. With ``on_reply``, every reply goes to
    ``on_reply(key, message)`` on the dispatching thread instead (nothing is kept: a
    call sent to several actors on one port gets one reply per actor, which names its
    rank, and the caller knows what to keep); the port then runs ``on_reply`` itself,
    with no frame in between, which is what keeps a single call as fast as a bare port.
    :meth:`send` is the only place the frames leave: a transport that fans a call
    out through the host agents (one message per host, replies batched per host)
    replaces its loop and nothing else. Close it (or use ``with``) to drop the ports;
    late replies are then discarded.
    """

    __slots__ = ("mailbox", "replies", "_on_reply", "_ports")

    def __init__(self, mailbox: Mailbox,
                 on_reply: Callable[[Hashable, wire_frames.Message], None] | None = None):
        self.mailbox = mailbox
        self.replies: dict[Hashable, wire_frames.Message] = {}
        self._on_reply = on_reply
        self._ports: list[int] = []

    def __enter__(self) -> "Gather":
        return self

    @protected
    def __exit__(self, *exc) -> None:
        self.close()

    @protected
    def open(self, key: Hashable = None) -> dict:
        """A reply port for ``key``; returns the header fields that route replies to it
        (``port``, ``reply``), to put in the request before it is encoded."""
        if self._on_reply is not None:
            arrived = functools.partial(self._on_reply, key)
        else:
            replies = self.replies

            def arrived(message: wire_frames.Message) -> None:
                replies.setdefault(key, message)

        mailbox = self.mailbox
        port = mailbox.open_port(arrived)
        self._ports.append(port)
        return {envelope.PORT: port, envelope.REPLY: mailbox.address}

    def send(self, addresses: Iterable[str], frames: list) -> None:
        """Send one encoded (and signed) frame set to every address of ``addresses``."""
        self.mailbox.send_to_each(addresses, frames)

    @protected
    def request(self, address: str, cluster_id: str, header: dict, body: bytes | None = None,
                buffers=(), key: Hashable = None) -> None:
        """Send ``header`` (plus a pickled ``body``) to ``address``, its reply kept under ``key``."""
        route = self.open(key)
        self.send((address,), wire_frames.encode(cluster_id, {**header, **route}, body, buffers))

    @protected
    def wait(self, count: int, timeout: float | None = None, check: Callable[[], None] | None = None) -> bool:
        """Block until ``count`` keys have a reply or ``timeout`` seconds pass (``None``: no
        limit); returns whether they all came (for a gather without ``on_reply``).
        ``check`` runs every ``CHECK_S`` seconds while waiting and may raise to give up
        (a peer known dead). Ctrl-C ends the wait; the ports stay open until
        :meth:`close`."""
        guard_main_thread()
        replies = self.replies
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            step = left if check is None else (CHECK_S if left is None else min(left, CHECK_S))
            if self.mailbox.wait(lambda: len(replies) >= count, step) or (left is not None and left <= step):
                return len(replies) >= count
            check()

    @protected
    def close(self) -> None:
        """Drop the reply ports (idempotent); replies arriving later are discarded.

        Also forgets ``on_reply``: it usually refers back to this gather (to close it
        when the last reply is in), and that cycle would leave every finished call to
        the cyclic garbage collector instead of freeing it at once."""
        for port in self._ports:
            self.mailbox.close_port(port)
        self._ports.clear()
        self._on_reply = None
