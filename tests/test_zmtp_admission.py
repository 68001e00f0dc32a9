"""Who gets a connection to an inbox at all (wire.zap): only a peer that gives its
cluster's PLAIN password at the ZMTP handshake. libzmq takes in every part of a
multi-part message before anyone can check its signature, so a peer speaking ZMTP
itself could make a process hold parts without end; now a peer without the key is
refused at the handshake, before any message, while a peer with the password still
has every frame set's signature checked (dropped and counted when bad)."""

from __future__ import annotations

import contextlib
import socket
import struct

import psutil
import zmq

from monarch_nb.wire import frames, sockets, zap
from conftest import wait_until
from sample_actors import Counter
from second_user import run_as_other_user
from test_unauthenticated_peers import _peak_rss, _reset_peak_rss

_MORE_LONG = b"\x03"  # ZMTP 3.0 frame flags: more parts follow, 8-byte length


def _greeting(mechanism: bytes) -> bytes:
    """A ZMTP 3.0 greeting naming ``mechanism`` (as a server would not: as-server 0)."""
    return b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\0") + b"\0" + bytes(31)


def _command(name: bytes, body: bytes) -> bytes:
    data = bytes([len(name)]) + name + body
    return b"\x04" + bytes([len(data)]) + data  # a short command frame


def _unfinished_messages(address: str, parts: int, part_bytes: int) -> tuple[list[int], list[int]]:
    """As the second user, hand-speaking ZMTP 3.0 over a plain TCP socket to ``address``:
    once as NULL (what libzmq admitted before), once as PLAIN with a wrong password, then
    ``parts`` parts of ``part_bytes`` of one message, each with the MORE flag, never the
    last. Returns the bytes of parts the kernel took on each connection before it was
    refused, and each connection's local port."""
    host, port = address[len("tcp://"):].rsplit(":", 1)
    part = _MORE_LONG + struct.pack(">Q", part_bytes) + bytes(part_bytes)
    taken, ports = [], []
    for mechanism, handshake in ((b"NULL", _command(b"READY", b"\x0bSocket-Type\x00\x00\x00\x04PUSH")),
                                 (b"PLAIN", _command(b"HELLO", b"\x05other\x05wrong"))):
        sent = 0
        with socket.create_connection((host, int(port)), timeout=120) as conn:
            ports.append(conn.getsockname()[1])
            try:
                conn.sendall(_greeting(mechanism) + handshake)
                for _ in range(parts):
                    conn.sendall(part)
                    sent += part_bytes
            except OSError:
                pass  # the connection was closed on us: refused
        taken.append(sent)
    return taken, ports


def _connected_from(pid: int, ports: list[int]) -> bool:
    """Whether process ``pid`` still has a TCP connection from one of ``ports``."""
    return any(c.raddr and c.raddr.port in ports for c in psutil.Process(pid).net_connections("tcp"))


def test_a_peer_hand_speaking_zmtp_without_the_key_makes_the_hub_hold_nothing_and_it_works_on(cluster, host):
    hub_pid, hub = cluster._info["hub_pid"], cluster._info["hub"]
    before = cluster.info()["hub_stats"]
    _reset_peak_rss(hub_pid)
    baseline = _peak_rss(hub_pid)
    taken, ports = run_as_other_user(_unfinished_messages, hub, 1024, 1 << 20, timeout=300)
    # Once the hub has closed both connections, it has read all that it ever will of them.
    assert wait_until(lambda: not _connected_from(hub_pid, ports), 60)
    procs = host.spawn_procs(per_host={"gpus": 1}, name="after_zmtp")
    try:
        assert procs.spawn("counter", Counter, 1).incr.call_one(2).get(timeout=60) == 3
    finally:
        procs.stop()
    grown = _peak_rss(hub_pid) - baseline
    assert grown < 128 << 20, f"the hub's peak resident memory grew by {grown >> 20} MiB (kernel took {taken})"
    after = cluster.info()["hub_stats"]
    assert after["refused_connections"] >= before["refused_connections"] + 1  # the wrong password, counted
    assert after["dropped_frames"] == before["dropped_frames"]  # nothing got as far as a message
    assert cluster.info()["hub_pid"] == hub_pid


def _monitored_push(address: str, cluster_id: str | None = None, password: bytes | None = None):
    """A PUSH socket to ``address`` (with credentials if given) and a monitor of its
    handshake outcomes."""
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    if cluster_id is not None:
        sock.setsockopt(zmq.PLAIN_USERNAME, cluster_id.encode())
        sock.setsockopt(zmq.PLAIN_PASSWORD, password if password is not None else zap._passwords[cluster_id.encode()])
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                      | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    sock.connect(address)
    return sock, monitor


def _handshake_outcome(monitor: zmq.Socket) -> int:
    assert monitor.poll(30_000), "no handshake outcome within 30 s"
    from zmq.utils.monitor import recv_monitor_message

    return recv_monitor_message(monitor)["event"]


def test_an_inbox_refuses_peers_without_the_clusters_password_at_the_handshake_and_delivers_nothing():
    frames.register_key("admission", b"a" * 32)
    frames.register_key("admission-other", b"o" * 32)
    inbox, address = sockets.bind_inbox()
    refused = zap.refused()
    attempts = [_monitored_push(address),  # no credentials: NULL, the mechanism refused
                _monitored_push(address, "admission", b"wrong"),  # a wrong password
                _monitored_push(address, "nobody", zap.password(b"a" * 32)),  # an unknown cluster
                _monitored_push(address, "admission", zap._passwords[b"admission-other"])]  # another's
    try:
        for sock, monitor in attempts:
            with contextlib.suppress(zmq.Again):  # (no pipe once refused: nothing queued)
                sock.send_multipart(frames.encode("admission", {"k": "never"}), zmq.NOBLOCK)
            assert _handshake_outcome(monitor) != zmq.EVENT_HANDSHAKE_SUCCEEDED
        assert zap.refused() >= refused + 3
        assert not inbox.poll(0)  # nothing was queued from any of them
        sock, monitor = _monitored_push(address, "admission")  # the right password
        attempts.append((sock, monitor))
        assert _handshake_outcome(monitor) == zmq.EVENT_HANDSHAKE_SUCCEEDED
        sock.send_multipart(frames.encode("admission", {"k": "welcome"}))
        assert inbox.poll(30_000) and frames.decode(sockets.recv_frames(inbox), None).header == {"k": "welcome"}
    finally:
        for sock, monitor in attempts:
            sock.disable_monitor()
            monitor.close(0)
            sock.close(0)
        inbox.close(0)


def test_a_peer_with_the_password_but_a_bad_signature_is_still_dropped_and_counted():
    frames.register_key("admission", b"a" * 32)
    inbox, address = sockets.bind_inbox()
    sock, monitor = _monitored_push(address, "admission")
    try:
        good = frames.encode("admission", {"k": "ok"})
        sock.send_multipart([b"MNB1" + bytes(32) + bytes(good[0])[36:], *good[1:]])  # the signature zeroed
        sock.send_multipart(good)
        dropped = frames.dropped()
        guard = frames.ReplayGuard()
        assert inbox.poll(30_000)
        try:
            frames.decode(sockets.recv_frames(inbox), guard)
            raise AssertionError("a badly signed frame set was accepted")
        except frames.BadMessage:
            pass
        assert frames.dropped() == dropped + 1
        assert inbox.poll(30_000) and frames.decode(sockets.recv_frames(inbox), guard).header == {"k": "ok"}
    finally:
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)
        inbox.close(0)


def test_the_zap_handler_admits_plain_with_a_known_clusters_password_only():
    frames.register_key("admission", b"a" * 32)
    good = zap.password(b"a" * 32)

    def request(mechanism=b"PLAIN", user=b"admission", secret=good, domain=zap.DOMAIN):
        return [b"1.0", b"7", domain, b"127.0.0.1", b"", mechanism, user, secret]

    assert zap.decide(request())[0] == b"200"
    assert zap.decide(request(secret=good[:-1] + b"0" if good[-1:] != b"0" else good[:-1] + b"1"))[0] == b"400"
    assert zap.decide(request(user=b"unknown"))[0] == b"400"
    assert zap.decide(request(domain=b"elsewhere"))[0] == b"400"
    assert zap.decide([b"1.0", b"7", zap.DOMAIN, b"127.0.0.1", b"", b"NULL"])[0] == b"400"
    assert zap.decide([b"0.9", b"7"])[0] == b"500"
    assert zap.password(b"a" * 32) != zap.password(b"b" * 32) and b"a" * 32 not in good


def test_a_send_to_a_process_that_refuses_the_clusters_credentials_fails_naming_it_not_for_ever(monkeypatch):
    """(A port of a gone proc reused by another cluster's: libzmq drops the pipe of a
    refused connection, and a send on it waited for ever.)"""
    from monarch_nb.errors import ClusterError

    frames.register_key("admission", b"a" * 32)
    monkeypatch.setattr(zap, "decide", lambda request: (b"400", b"not ours", b""))
    inbox, address = sockets.bind_inbox()
    outbox = sockets.Outbox()
    try:
        def refused_at_once() -> bool:
            try:
                outbox.send(address, frames.encode("admission", {"k": "x"}))
            except ClusterError as e:
                assert "refused the connection" in str(e)
                return True
            return False

        assert wait_until(refused_at_once, 30)
        assert not inbox.poll(0)
    finally:
        outbox.forget(address)
        inbox.close(0)


def _read_command(conn: socket.socket) -> bytes:
    flags, size = conn.recv(2, socket.MSG_WAITALL)
    assert flags == 0x04, f"expected a short command, got flags {flags}"
    return conn.recv(size, socket.MSG_WAITALL)


def test_an_admitted_connection_half_way_through_a_message_leaves_the_inbox_unreadable():
    """(A ZAP user id reaches the inbox's pipe as a credential message, flushed before a
    large message has all arrived: the socket polled readable with nothing to receive, and
    a mailbox's non-blocking receive raised zmq.Again: two hosts' large calls failed.)"""
    frames.register_key("admission", b"a" * 32)
    inbox, address = sockets.bind_inbox()
    host, port = address[len("tcp://"):].rsplit(":", 1)
    secret = zap._passwords[b"admission"]
    try:
        with socket.create_connection((host, int(port)), timeout=30) as conn:
            conn.sendall(_greeting(b"PLAIN") + _command(b"HELLO", bytes([9]) + b"admission" + bytes([len(secret)])
                                                          + secret))
            conn.recv(64, socket.MSG_WAITALL)  # the inbox's greeting
            assert _read_command(conn).startswith(b"\x07WELCOME")
            conn.sendall(_command(b"INITIATE", b"\x0bSocket-Type\x00\x00\x00\x04PUSH"))
            assert _read_command(conn).startswith(b"\x05READY")
            # A first part, and half of a 1 MiB second part.
            conn.sendall(b"\x01\x05first" + b"\x02" + struct.pack(">Q", 1 << 20) + bytes(1 << 19))
            assert not inbox.poll(1000) and not inbox.getsockopt(zmq.EVENTS) & zmq.POLLIN
            conn.sendall(bytes(1 << 19))  # the rest: now there is a message
            assert inbox.poll(30_000) and [len(f) for f in inbox.recv_multipart(zmq.NOBLOCK)] == [5, 1 << 20]
    finally:
        inbox.close(0)
