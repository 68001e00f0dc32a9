"""zmq sockets the way monarch_nb uses them.

Every participant (client, proc actor, hub, host agent) receives on PULL sockets it
binds on loopback (or the interface an allocator names) and sends through PUSH
sockets connected to the peer's address, cached per thread (zmq sockets must not be
used by two threads at once) and closed once the peer is known gone or they go unused
(``Outbox``). The reply address travels in each message's header.
"""

from __future__ import annotations

import functools
import os
import resource
import threading
import time
import weakref
from collections.abc import Iterable

import zmq

from .. import fd_limit
from ..errors import ClusterError
from . import frames as wire_frames
from . import shm, stream, zap
from .interrupts import protected

# How long a closed sending socket keeps trying to deliver what it has queued (ms).
# Not 0: a thread that sends a reply and then exits (an actor whose __init__ failed,
# a stopped actor) closes its socket at once, and the reply must still go out.
SEND_LINGER_MS = 2000

_SNDMORE = int(zmq.SNDMORE)
# pyzmq's flags as plain ints, for the hot loops: its enums' ``&`` runs in Python.
NOBLOCK, EVENTS, POLLIN = int(zmq.NOBLOCK), int(zmq.EVENTS), int(zmq.POLLIN)

# Sending sockets to peers that are gone (a client whose kernel restarted) must not
# pile up: libzmq retries each every 100 ms by default. Back off to 1 s, and close a
# thread's socket once it has gone unused this long (seconds).
RECONNECT_IVL_MAX_MS = 1000
IDLE_SOCKET_S = 60.0

# How long a sender waits for a message that holds large buffers to leave the
# process before the buffers may be reused (seconds).
SEND_DRAIN_TIMEOUT_S = 60.0


DEFAULT_MAX_SOCKETS = 1023  # libzmq's ZMQ_MAX_SOCKETS_DFLT

# Connections an inbox's accept queue holds while its I/O thread is not scheduled. Every
# proc of a mesh answers a call or a status request at once; on a loaded host the I/O
# thread may not run before more than libzmq's default of 100 SYNs arrive, and Linux
# drops the rest: each of those peers then waits for TCP's 1 s retransmission (the
# one-second step in health() and first calls at ~128 procs, issue 24). The kernel
# caps the figure at net.core.somaxconn; asking for more costs nothing.
MAX_LISTEN_BACKLOG = 65535


def listen_backlog() -> int:
    """The accept-queue length to ask for: ``net.core.somaxconn`` (the kernel's cap),
    at least 4,096 where it cannot be read."""
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return min(MAX_LISTEN_BACKLOG, max(4096, int(f.read())))
    except (OSError, ValueError):
        return 4096


def bind_host() -> str:
    """Interface to bind on: ``MONARCH_NB_BIND`` or loopback."""
    return os.environ.get("MONARCH_NB_BIND", "127.0.0.1")


def max_sockets() -> int:
    """How many sockets a zmq context of this process may hold: as many as the process
    may open files (each socket holds at least one descriptor). libzmq's default of
    1,023 refused the 1,024th socket with "Too many open files" however high the file
    limit: a client holds one socket per actor it calls, so its fifth mesh of 256 actors
    failed to spawn (issue 24). The hard limit counts, not the soft one: every process
    raises its soft limit to it (``fd_limit``), maybe after its context was made."""
    soft, hard = fd_limit.limits()
    hard = fd_limit.RAISE_TO_AT_MOST if hard == resource.RLIM_INFINITY else hard
    return max(DEFAULT_MAX_SOCKETS, min(max(soft, hard), fd_limit.RAISE_TO_AT_MOST))


def sized(ctx: zmq.Context) -> zmq.Context:
    """``ctx``, able to hold :func:`max_sockets` sockets (at most libzmq's own limit,
    ``SOCKET_LIMIT``); call it before its first socket: libzmq sizes a context's socket
    table as it makes the first, and keeps that size. Costs ~0.2 MiB at 65,535."""
    ctx.set(zmq.MAX_SOCKETS, min(max_sockets(), ctx.get(zmq.SOCKET_LIMIT)))
    return ctx


class _ProcessContext(zmq.Context):
    """The process's shared context (:func:`context`), :func:`sized` as it is made."""

    # Its own singleton: pyzmq's, made first by a library or the user's code with
    # ``zmq.Context.instance()``, is not sized, and ``instance()`` would return it.
    _instance = None
    _instance_pid = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        sized(self)


def context() -> zmq.Context:
    """This process's zmq context (re-created after fork)."""
    return _ProcessContext.instance()


def first_reply_port() -> int:
    """Where an inbox's reply ports start counting: at random (48 bits), not at 1. A
    process that binds the address of one that died (a recovered hub, with ``prefer``)
    would otherwise take the late replies to the dead one's first requests, still queued
    to that address, as the answers to its own (same port numbers): a recovered hub took
    an agent's late spawn reply for its answer to ``adopt``, and failed."""
    return int.from_bytes(os.urandom(6), "little") + 1


def bind_inbox(ctx: zmq.Context | None = None, prefer: str | None = None) -> tuple[zmq.Socket, str]:
    """A PULL socket bound on a free port of :func:`bind_host`; returns ``(socket, address)``.

    ``prefer``: an address to take if it is free (a restarted hub takes its
    predecessor's), else a random port is used."""
    ctx = ctx or context()
    zap.serve(ctx)
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    # Only a peer holding the cluster's key gets a connection at all: libzmq takes in every
    # part of a message before anyone can check its signature (wire.zap).
    zap.admit(sock)
    # A frame announced larger closes its connection before libzmq allocates it: anyone
    # who can reach the port could otherwise make this process hold up to the largest
    # message before its signature is checked (frames.MAX_FRAME_BYTES).
    sock.setsockopt(zmq.MAXMSGSIZE, wire_frames.MAX_FRAME_BYTES)
    sock.setsockopt(zmq.BACKLOG, listen_backlog())
    if prefer is not None:
        try:
            sock.bind(prefer)
            return sock, prefer
        except zmq.ZMQError:
            pass
    host = bind_host()
    port = sock.bind_to_random_port(f"tcp://{host}")
    return sock, f"tcp://{host}:{port}"


def queued(sock: zmq.Socket) -> bool:
    """Whether a message is waiting on ``sock`` now (its EVENTS: cheaper than a receive
    that fails with ``zmq.Again``, which costs pyzmq an exception and a string decode)."""
    return bool(int(sock.getsockopt(EVENTS)) & POLLIN)


def recv_frames(sock: zmq.Socket, flags: int = 0) -> list:
    """Receive one frame set; large frames stay zero-copy ``zmq.Frame`` objects. Blocks
    (without ``zmq.NOBLOCK``) until one is there; a wait while this thread's inbox holds
    half-received streams counts toward dropping them (``stream.wait_idle``)."""
    reading = stream.reading
    if not flags & NOBLOCK:
        held = getattr(reading, "streams", None)
        if held is not None and held[1] is sock and held[0]:
            stream.wait_idle(held[0], sock.poll)  # a half stream of a dead sender goes while this waits
    reading.socket = sock
    # As recv_multipart(copy=False), asking each frame whether more follow instead of
    # the socket (getsockopt(RCVMORE) through pyzmq's enum layer, once per frame).
    frame = sock.recv(flags, copy=False)
    frames = [frame]
    while frame.more:  # the rest of a frame set is there once its first frame is
        frame = sock.recv(flags, copy=False)
        frames.append(frame)
    return frames


class _ThreadSockets:
    """One thread's sending sockets of one :class:`Outbox`: the thread creates and uses
    them; any thread may close them (a peer known gone, an idle sweep). ``lock`` is held
    around every use and close: zmq sockets may change threads only across such a
    barrier, and a socket must not be closed in the middle of a send."""

    __slots__ = ("lock", "sockets", "credentials", "used", "forks", "__weakref__")

    def __init__(self):
        self.lock = threading.Lock()
        self.sockets: dict[str, zmq.Socket] = {}
        self.credentials: dict[str, bytes | None] = {}  # address -> the cluster its socket presents
        self.used: dict[str, float] = {}  # address -> when last sent to (monotonic)
        self.forks = _forks  # made in this process: no fork since

    def close(self, address: str, linger: int | None = None) -> None:
        """Close the socket to ``address`` if there is one; the caller holds ``lock``.
        ``linger``: ms to keep delivering what it queues (``None``: ``SEND_LINGER_MS``)."""
        self.used.pop(address, None)
        self.credentials.pop(address, None)
        sock = self.sockets.pop(address, None)
        if sock is not None:
            sock.close(linger)


# Every thread's sockets in this process, so that a peer known gone has its sockets
# closed in all of them at once, and idle ones are swept whichever thread still sends.
_tables: "weakref.WeakSet[_ThreadSockets]" = weakref.WeakSet()
_tables_lock = threading.Lock()
_next_sweep = time.monotonic() + IDLE_SOCKET_S


# Forks this process went through: a thread's table made before the latest one holds
# the parent's sockets. (Counted rather than comparing os.getpid(), a system call per send.)
_forks = 0


def _after_fork_in_child() -> None:
    global _tables, _tables_lock, _forks
    _tables, _tables_lock = weakref.WeakSet(), threading.Lock()  # the parent's sockets are not ours
    _forks += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


def _all_tables() -> list[_ThreadSockets]:
    with _tables_lock:
        return list(_tables)


def sweep_idle() -> None:
    """Close the sockets idle for ``IDLE_SOCKET_S``, if a sweep is due: for a thread that
    may go on without sending (a host router, whose sockets to the actors of a stopped
    mesh were kept, each reconnecting to a closed port, until its next call)."""
    now = time.monotonic()
    if now > _next_sweep:
        _sweep_idle(now)


@protected
def _sweep_idle(now: float) -> None:
    """Close every thread's sockets unused for ``IDLE_SOCKET_S`` (after they deliver
    what they hold): the backstop for peers nobody said were gone."""
    global _next_sweep
    _next_sweep = now + IDLE_SOCKET_S
    for table in _all_tables():
        with table.lock:  # the loop in a function of its own: see monarch_nb.wire.interrupts
            _close_idle(table, now)


def _close_idle(table: _ThreadSockets, now: float) -> None:
    """Close ``table``'s sockets unused for ``IDLE_SOCKET_S``. The caller holds its lock."""
    for address in [a for a, t in table.used.items() if now - t > IDLE_SOCKET_S]:
        table.close(address)


def _refused(address: str) -> ClusterError:
    return ClusterError(
        f"{address} refused the connection: the process there does not hold this cluster's key "
        "(a process of another cluster on a reused port?); the one this message was for is gone")


class Outbox:
    """Per-thread PUSH sockets, one per destination address. Those to a peer known gone
    are closed at once in every thread (:meth:`discard`); those unused for
    ``IDLE_SOCKET_S`` seconds are closed at the next send of any thread after that
    (after delivering what they hold), so that a long-lived client keeps a flat number
    of file descriptors and libzmq does not keep reconnecting to dead addresses."""

    def __init__(self, ctx: zmq.Context | None = None):
        self._ctx = ctx
        self._local = threading.local()

    def _table(self) -> _ThreadSockets:
        """This thread's sockets (made and registered on first use in a process)."""
        table = getattr(self._local, "table", None)
        if table is None or table.forks != _forks:
            table = self._local.table = _ThreadSockets()
            with _tables_lock:
                _tables.add(table)
        return table

    def _socket(self, table: _ThreadSockets, address: str, now: float, cluster_id: bytes | None) -> zmq.Socket:
        """This thread's socket to ``address``, connecting with ``cluster_id``'s
        credentials (``wire.zap``; ``None``: none, the peer refuses it); the caller holds
        ``table.lock``."""
        sock = table.sockets.get(address)
        if sock is not None and cluster_id is not None and table.credentials[address] != cluster_id:
            # A socket left from another cluster's process at this address (a client that
            # ran several clusters; the OS gave a stopped one's port to this one's proc):
            # its handshake is refused there, and what it queued would be dropped without
            # a word (a call that never returns). Its own peer is gone: drop its queue.
            table.close(address, 0)
            sock = None
        table.used[address] = now
        if sock is None:
            sock = (self._ctx or context()).socket(zmq.PUSH)
            if cluster_id is not None:
                zap.present(sock, cluster_id)
            sock.setsockopt(zmq.LINGER, SEND_LINGER_MS)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
            # With no high-water mark a send waits only when the socket has no pipe left,
            # which is after the peer refused the handshake (wire.zap): fail it at once
            # (send raises) instead of waiting for ever.
            sock.setsockopt(zmq.SNDTIMEO, 0)
            sock.connect(address)
            table.sockets[address] = sock
            table.credentials[address] = cluster_id
        return sock

    @protected
    def connect(self, addresses: list[str], cluster_id: bytes) -> None:
        """Make this thread's sockets to ``addresses`` now, so that their connections
        (TCP, then the handshake the peer's credential check answers: ``wire.zap``) are
        made in the background, not by the first send. Never waits. A first call to a
        fresh 128-proc mesh paid ~100 ms of connecting here, in one burst."""
        table = self._table()
        now = time.monotonic()
        with table.lock:
            for address in addresses:
                self._socket(table, address, now, cluster_id)

    @protected
    def send(self, address: str, frames: list, wait: bool = True) -> None:
        """Send ``frames`` to ``address``, whole: never interrupted between two frames
        (``wire.interrupts``); a send that fails half way closes its socket, so that
        the torn message is never completed by the next one. When the message carries
        large buffers, wait until they have left this process (or were copied to shared
        memory, for a peer on this host: ``wire.shm``; to another host the largest go
        ahead of the message in chunks on the same socket: ``wire.stream``) so the caller
        may reuse them; ``wait=False``: return once they are queued, for a sender whose
        buffers nobody changes (received frames it passes on) and that must not be held
        by one peer gone or not reading (a host router, which serves every client). The
        routing runs under this thread's socket lock, so a :meth:`discard` from another
        thread waits for a send in progress.

        Raises :class:`ClusterError` when they can't leave within
        ``SEND_DRAIN_TIMEOUT_S`` (the peer is gone or not reading; only with ``wait``),
        or the peer refused this cluster's credentials at the handshake (``wire.zap``)."""
        now = time.monotonic()
        if now > _next_sweep:
            _sweep_idle(now)  # before taking this thread's lock: it takes every thread's
        table = self._table()
        trackers: list = []  # of large frames sent zero-copy, to wait on
        try:
            with table.lock:
                sock = self._socket(table, address, now, wire_frames.cluster_of(frames))
                if len(frames) == wire_frames.FIXED_FRAMES and not wire_frames.needs_route(frames):
                    sock.send(wire_frames.pack(frames))  # small: one send, not three
                    return
                frames = wire_frames.route(address, frames, functools.partial(stream.send, sock, trackers))
                buffers = frames[wire_frames.FIXED_FRAMES:]
                if not buffers or sum(memoryview(f).nbytes for f in buffers) < zmq.COPY_THRESHOLD:
                    # send_multipart's per-frame enum arithmetic costs more than a small send.
                    for frame in frames[:-1]:
                        sock.send(frame, _SNDMORE)
                    sock.send(frames[-1])
                else:
                    trackers.append(sock.send_multipart(frames, copy=False, track=True))
        except BaseException as e:
            self._failed(address, e)
            raise
        if not trackers or not wait:  # (zero-copy frames hold their buffers until libzmq is done)
            return
        deadline = time.monotonic() + SEND_DRAIN_TIMEOUT_S
        try:
            for tracker in trackers:
                tracker.wait(max(0.0, deadline - time.monotonic()))
        except zmq.NotDone:
            self.forget(address)
            raise ClusterError(
                f"could not deliver a message to {address} within {SEND_DRAIN_TIMEOUT_S} s; "
                "the receiving process is gone or not reading"
            ) from None

    @protected
    def send_to_each(self, addresses: Iterable[str], frames: list) -> None:
        """:meth:`send` ``frames`` to each of ``addresses`` in turn (a call over a mesh's
        actors). A small frame set, the usual call, is checked and packed once for all,
        not once per address: that was a third of a client's work per actor. Raises as
        :meth:`send` does, at the first address that fails; the later ones are not sent."""
        if len(frames) != wire_frames.FIXED_FRAMES or wire_frames.needs_route(frames):
            for address in addresses:
                self.send(address, frames)
            return
        now = time.monotonic()
        if now > _next_sweep:
            _sweep_idle(now)
        table = self._table()
        cluster_id, packed = wire_frames.cluster_of(frames), wire_frames.pack(frames)
        for address in addresses:
            try:
                with table.lock:
                    self._socket(table, address, now, cluster_id).send(packed)
            except BaseException as e:
                self._failed(address, e)
                raise

    def _failed(self, address: str, error: BaseException) -> None:
        """A send to ``address`` raised ``error``: its socket is dropped (what it queued
        may be half a message), and ``zmq.Again``, which a socket with no high-water mark
        raises only once the peer refused its handshake, becomes the error
        :func:`_refused` names; any other error goes on as the caller re-raises it."""
        self.forget(address)
        if isinstance(error, zmq.Again):
            raise _refused(address) from None

    @staticmethod
    @protected
    def discard(address: str) -> None:
        """The peer at ``address`` is gone: close every thread's socket to it now,
        dropping what they still queue (an actor restarted at the same address must not
        get it, and nothing keeps reconnecting to a dead address)."""
        for table in _all_tables():
            with table.lock:
                table.close(address, 0)
        shm.unlink_sent(address)

    @protected
    def close_thread_sockets(self) -> None:
        """Close this thread's sockets, delivering what they hold (a thread about to end)."""
        table = self._table()
        with table.lock:
            for address in list(table.sockets):
                table.close(address)

    @protected
    def forget(self, address: str) -> None:
        """Close this thread's socket to ``address`` (dropping anything queued)."""
        table = self._table()
        with table.lock:
            table.close(address, 0)
