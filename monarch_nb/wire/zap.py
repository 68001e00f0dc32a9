"""Who may connect to an inbox at all: ZMTP's PLAIN mechanism on every bound socket,
checked by a ZAP handler (ZeroMQ RFC 27) of our own in each zmq context that binds one.

A frame set's signature is checked only once libzmq has handed over the whole message,
and libzmq takes in every part of a multi-part message before it hands over any: a peer
that speaks ZMTP itself could send parts for ever and never the last one, and the
receiver held them all (1024 parts of 1 MiB took the hub to +1028 MiB). With PLAIN, a
connection carries no message at all until its handshake passed: the peer names a
cluster id as its user name and gives that cluster's connection password
(:func:`password`, derived from the cluster's key), and the handler accepts it only if
this process holds that cluster's key. A peer without the key is refused at the
handshake (the connection closed, nothing delivered); what it can make the receiver hold
before that is one handshake command, at most ``frames.MAX_FRAME_BYTES`` (MAXMSGSIZE).

This is admission, not a replacement for signatures: PLAIN sends the password in clear
(a host on the path between two hosts of a multi-host cluster could read it), and
nothing after the handshake is covered by it, so every frame set is still verified
(``wire.frames``). PLAIN costs nothing per message: after the handshake the frames on
the wire are the same as without it (``bench/bench_zap.py``).

One handler per context: a thread serving ``inproc://zeromq.zap.01`` (where libzmq asks),
started by the first :func:`serve` for that context in this process, ending when the
context is terminated. Inboxes also set ZAP_ENFORCE_DOMAIN, so a context without a
handler refuses every connection instead of admitting anyone.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading

import zmq

ENDPOINT = "inproc://zeromq.zap.01"  # fixed by RFC 27: where libzmq sends its requests
DOMAIN = b"monarch_nb"
_VERSION = b"1.0"
_PLAIN = b"PLAIN"
_OK, _DENIED, _FAILED = b"200", b"400", b"500"

_passwords: dict[bytes, bytes] = {}  # cluster id -> the password its peers must give
_served: set[tuple[int, int]] = set()  # (pid, libzmq context address) with a handler running
_lock = threading.Lock()
_refused = 0  # handshakes refused by this process's handlers


def password(key: bytes) -> bytes:
    """The PLAIN password of a cluster whose signing key is ``key`` (64 hex bytes): a
    one-way derivation, so someone who reads it off the network does not learn the key."""
    return hmac.digest(key, b"monarch_nb zmq PLAIN password", "sha256").hex().encode()


def trust(cluster_id: str, key: bytes) -> None:
    """Admit peers that give ``cluster_id``'s password (called with ``frames.register_key``)."""
    _passwords[cluster_id.encode()] = password(key)


def refused() -> int:
    """How many connections this process's inboxes refused at the handshake (no or a
    wrong password, an unknown cluster, a mechanism other than PLAIN)."""
    return _refused


def admit(sock: zmq.Socket) -> None:
    """Make ``sock`` (before it binds) a PLAIN server that asks its context's handler
    (:func:`serve` it first) about every connection, and refuses all if there is none."""
    sock.setsockopt(zmq.PLAIN_SERVER, 1)
    sock.setsockopt(zmq.ZAP_DOMAIN, DOMAIN)
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)


def present(sock: zmq.Socket, cluster_id: bytes | str) -> None:
    """Make ``sock`` (before it connects) give ``cluster_id``'s credentials at every
    handshake. Raises ``KeyError`` when this process does not hold that cluster's key."""
    cid = cluster_id.encode() if isinstance(cluster_id, str) else cluster_id
    secret = _passwords[cid]
    sock.setsockopt(zmq.PLAIN_USERNAME, cid)
    sock.setsockopt(zmq.PLAIN_PASSWORD, secret)


def serve(ctx: zmq.Context) -> None:
    """Make sure ``ctx`` has our ZAP handler (started once per context and process; the
    handler's socket is bound before this returns, so no handshake can miss it). Never
    blocks on peers."""
    key = (os.getpid(), ctx.underlying)
    with _lock:
        if key in _served:
            return
        sync: zmq.Context = zmq.Context.shadow(ctx.underlying)  # (an asyncio context's sockets can't serve a thread)
        sock = sync.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(ENDPOINT)
        _served.add(key)
    threading.Thread(target=_handle, args=(sock, key), name="monarch-nb-zap", daemon=True).start()


def decide(request: list[bytes]) -> tuple[bytes, bytes, bytes]:
    """``(status code, status text, user id)`` for one ZAP request's frames (the user id
    always empty)."""
    if len(request) < 6 or request[0] != _VERSION:
        return _FAILED, b"malformed ZAP request", b""
    if request[2] != DOMAIN:
        return _DENIED, b"not a monarch_nb socket", b""
    if request[5] != _PLAIN or len(request) != 8:
        return _DENIED, b"monarch_nb admits PLAIN with its cluster's password only", b""
    expected = _passwords.get(request[6])
    if expected is None or not hmac.compare_digest(expected, request[7]):
        return _DENIED, b"unknown cluster or wrong password", b""
    # No user id: libzmq would put it in the connection's pipe as a credential message,
    # which makes the socket poll readable with nothing to receive (a mailbox's poll said
    # a message was there, and its non-blocking receive raised zmq.Again).
    return _OK, b"OK", b""


def _handle(sock: zmq.Socket, key: tuple[int, int]) -> None:
    """Answer every ZAP request of one context until the context is terminated."""
    global _refused
    try:
        while True:
            try:
                request = sock.recv_multipart()
            except zmq.ContextTerminated:
                return
            try:
                code, text, user = decide(request)
            except Exception:  # noqa: BLE001 - one bad request must not end admission for all
                code, text, user = _FAILED, b"internal error", b""
            if code != _OK:
                with _lock:
                    _refused += 1
            request_id = request[1] if len(request) > 1 else b""
            try:
                sock.send_multipart([_VERSION, request_id, code, text, user, b""])
            except zmq.ContextTerminated:
                return
    finally:
        # Forgotten before the socket closes: the context's term() returns only after
        # that, and a new context may then get the same address.
        with _lock:
            _served.discard(key)
        sock.close(0)


def _after_fork_in_child() -> None:
    global _lock
    _served.clear()  # the parent's handler threads are not in the child
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
