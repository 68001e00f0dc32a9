"""Who is on the other end of a loopback TCP connection: the uid that owns the peer's
socket, as the kernel records it.

A TCP port on 127.0.0.1 takes connections from every local user. For each socket,
``/proc/net/tcp`` (and ``tcp6``) lists its local and remote address, its state and the
uid that created it (the ``uid`` column; any user may read it). The peer's end of an
accepted connection is the row whose local address is our peer's and whose remote
address is our own; its uid is the peer's. This is what lets the IDE relay admit only
its own user (VS Code attaches with a host and a port: TCP stays).
"""

from __future__ import annotations

import ipaddress
import socket

TABLES = {socket.AF_INET: "/proc/net/tcp", socket.AF_INET6: "/proc/net/tcp6"}


def _hex_address(address: tuple) -> str:
    """``("127.0.0.1", 5000)`` as ``/proc/net/tcp`` writes it: ``0100007F:1388`` (each
    32-bit word of the address in host byte order, then the port)."""
    packed = ipaddress.ip_address(address[0]).packed
    words = "".join(f"{int.from_bytes(packed[i:i + 4], 'little'):08X}" for i in range(0, len(packed), 4))
    return f"{words}:{address[1]:04X}"


def uid_in(table: str, local: tuple, remote: tuple) -> int | None:
    """The uid of the socket whose local address is ``local`` and remote is ``remote``
    in ``table`` (the text of ``/proc/net/tcp`` or ``tcp6``), ``None`` when no row has
    them (the socket closed meanwhile)."""
    want = (_hex_address(local), _hex_address(remote))
    for row in table.splitlines()[1:]:
        fields = row.split()
        if len(fields) > 7 and (fields[1], fields[2]) == want:
            return int(fields[7])
    return None


def peer_uid(conn: socket.socket) -> int | None:
    """The uid owning the other end of ``conn``, an accepted TCP connection from this
    host (``None``: not found, e.g. the peer already closed, or not a local peer).
    Reads ``/proc/net/tcp`` or ``tcp6`` once (~0.1 ms per 100 sockets)."""
    table = TABLES.get(conn.family)
    if table is None:
        return None
    try:
        with open(table) as f:
            text = f.read()
        return uid_in(text, conn.getpeername()[:2], conn.getsockname()[:2])
    except (OSError, ValueError):
        return None
