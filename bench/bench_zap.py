"""What ZMTP PLAIN admission (wire.zap) costs, and what a peer without the key can make an
inbox hold with it and without it.

    cd /work/main && .venv/bin/python bench/bench_zap.py [--rounds 5]

All in this process, over loopback TCP (no cluster):
  1. throughput  frames of just under 4 MiB (the largest a socket carries; larger ones
                 stream or go through shared memory), 16 per round, PUSH -> PULL, with PLAIN + our ZAP handler
                 (sockets.bind_inbox, credentials) against the same sockets without any
                 mechanism (NULL), interleaved rounds, median GB/s
  2. small       10,000 small frames one way, the same two ways, median messages/s
  3. handshake   a new connection's first message (connect, handshake, deliver), median ms
                 over 200 new connections each way: PLAIN adds one ZAP round trip
  (attacks first: memory freed by the other figures stays in malloc's heap, unseen by RSS)
  4. attack A    one connection hand-speaking ZMTP that sends 256 parts of 1 MiB of one
                 message, never the last: how much the receiver's RSS grew (NULL: all of
                 it; PLAIN: refused at the handshake)
  5. attack B    N connections that each announce a PLAIN HELLO of 4 MiB - 100 bytes and
                 send it, never finishing the handshake: RSS growth per connection (what is
                 left: libzmq reads a handshake command up to MAXMSGSIZE)
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import time

import zmq

from monarch_nb.wire import frames, sockets, zap

MiB = 1 << 20
CID = "bench-zap"


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _plain_inbox() -> tuple[zmq.Socket, str]:
    """An inbox without admission: what bind_inbox made before wire.zap."""
    sock = zmq.Context.instance().socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, frames.MAX_FRAME_BYTES)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return sock, f"tcp://127.0.0.1:{port}"


def _pusher(address: str, admitted: bool) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    if admitted:
        zap.present(sock, CID)
    sock.connect(address)
    return sock


def _throughput(inbox: zmq.Socket, out: zmq.Socket, payload: bytes, count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        out.send(payload, copy=False)
    for _ in range(count):
        inbox.recv(copy=False)
    return len(payload) * count / (time.perf_counter() - started) / 1e9


def _small_rate(inbox: zmq.Socket, out: zmq.Socket, count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        out.send(b"x" * 64)
    for _ in range(count):
        inbox.recv()
    return count / (time.perf_counter() - started)


def _first_message_ms(inbox: zmq.Socket, address: str, admitted: bool) -> float:
    started = time.perf_counter()
    out = _pusher(address, admitted)
    out.send(b"hello")
    inbox.recv()
    elapsed = time.perf_counter() - started
    out.close(0)
    return elapsed * 1000


def _greeting(mechanism: bytes) -> bytes:
    return b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\0") + b"\0" + bytes(31)


def _command(name: bytes, body: bytes) -> bytes:
    data = bytes([len(name)]) + name + body
    return b"\x04" + bytes([len(data)]) + data


def _settle(before: int) -> int:
    """RSS growth once the receiver's I/O thread has read what it will (it stops growing)."""
    last, stable = _rss(), 0
    while stable < 5:
        time.sleep(0.1)
        now = _rss()
        stable = stable + 1 if now == last else 0
        last = now
    return last - before


def _unfinished_message(address: str, mechanism: bytes, parts: int) -> int:
    host, port = address[len("tcp://"):].rsplit(":", 1)
    handshake = (_command(b"READY", b"\x0bSocket-Type\x00\x00\x00\x04PUSH") if mechanism == b"NULL"
                 else _command(b"HELLO", b"\x05other\x05wrong"))
    before = _rss()
    conn = socket.create_connection((host, int(port)))
    part = b"\x03" + struct.pack(">Q", MiB) + bytes(MiB)
    try:
        conn.sendall(_greeting(mechanism) + handshake)
        for _ in range(parts):
            conn.sendall(part)
    except OSError:
        pass
    grown = _settle(before)
    conn.close()
    return grown


def _big_hellos(address: str, connections: int) -> int:
    host, port = address[len("tcp://"):].rsplit(":", 1)
    size = frames.MAX_FRAME_BYTES - 100
    before = _rss()
    conns = []
    for _ in range(connections):
        conn = socket.create_connection((host, int(port)))
        try:
            conn.sendall(_greeting(b"PLAIN") + b"\x06" + struct.pack(">Q", size) + bytes(size - 16))
        except OSError:
            pass
        conns.append(conn)
    grown = _settle(before)
    for conn in conns:
        conn.close()
    return grown


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hellos", type=int, default=32)
    args = parser.parse_args()
    frames.register_key(CID, b"z" * 32)
    admitted_inbox, admitted_address = sockets.bind_inbox()
    plain_inbox, plain_address = _plain_inbox()
    admitted_out, plain_out = _pusher(admitted_address, True), _pusher(plain_address, False)
    # The attacks first, in a fresh process: memory freed by earlier figures stays in
    # malloc's heap and would be reused without showing in RSS.
    hellos = _big_hellos(admitted_address, args.hellos)
    print(f"[attack B, {args.hellos} connections each in a {frames.MAX_FRAME_BYTES - 100}-byte HELLO] PLAIN inbox "
          f"grew {hellos / MiB:.0f} MiB ({hellos / args.hellos / MiB:.2f} MiB per connection, until its "
          f"handshake times out: ZMQ_HANDSHAKE_IVL, 30 s)")
    print(f"[attack A, 256 x 1 MiB parts never finished] NULL inbox grew "
          f"{_unfinished_message(plain_address, b'NULL', 256) / MiB:.0f} MiB; PLAIN inbox grew "
          f"{_unfinished_message(admitted_address, b'NULL', 256) / MiB:.0f} MiB (as NULL), "
          f"{_unfinished_message(admitted_address, b'PLAIN', 256) / MiB:.0f} MiB (wrong password); "
          f"refused handshakes {zap.refused()}")
    payload = bytes(frames.MAX_FRAME_BYTES - 1)  # the largest frame a socket carries (larger ones stream)
    big = {"PLAIN": [], "NULL": []}
    small = {"PLAIN": [], "NULL": []}
    first = {"PLAIN": [], "NULL": []}
    _throughput(admitted_inbox, admitted_out, payload, 4)  # warm-ups (and the handshakes)
    _throughput(plain_inbox, plain_out, payload, 4)
    for _ in range(args.rounds):
        big["PLAIN"].append(_throughput(admitted_inbox, admitted_out, payload, 16))
        big["NULL"].append(_throughput(plain_inbox, plain_out, payload, 16))
        small["PLAIN"].append(_small_rate(admitted_inbox, admitted_out, 10_000))
        small["NULL"].append(_small_rate(plain_inbox, plain_out, 10_000))
        for _ in range(40):
            first["PLAIN"].append(_first_message_ms(admitted_inbox, admitted_address, True))
            first["NULL"].append(_first_message_ms(plain_inbox, plain_address, False))
    for name, values, unit in (("4 MiB frames one way", big, "GB/s"), ("64 B frames one way", small, "msg/s"),
                               ("new connection, first message", first, "ms")):
        p, n = statistics.median(values["PLAIN"]), statistics.median(values["NULL"])
        print(f"[{name}] PLAIN+ZAP {p:,.3f} {unit}, NULL {n:,.3f} {unit} ({p / n:.2f}x)")
    for sock in (admitted_out, plain_out, admitted_inbox, plain_inbox):
        sock.close(0)


if __name__ == "__main__":
    main()
