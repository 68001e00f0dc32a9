"""Choosing the network interface to bind on when a cluster spans hosts.

A process binds where its peers can reach it. The rule used everywhere: bind on the
local address the kernel would use to send to the peer (the hub, or the nodes of an
allocation), found with a connected UDP socket, which sends nothing. A peer on
loopback gives loopback, so single-machine clusters stay on 127.0.0.1; 0.0.0.0 is
never chosen.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit


def host_of(address: str) -> str:
    """``"tcp://10.0.0.5:4242"`` -> ``"10.0.0.5"``."""
    return urlsplit(address).hostname or ""


def route_source(peer: str) -> str:
    """The local IPv4 address that traffic to ``peer`` (an IP or a resolvable name)
    leaves from. Raises ``OSError`` when there is no route to it."""
    ip = socket.gethostbyname(peer)
    if ipaddress.ip_address(ip).is_loopback:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((ip, 9))  # UDP connect picks the route; no packet is sent
        return probe.getsockname()[0]


def check_bind_address(ip: str) -> str:
    """``ip`` if it names one interface of this machine; raises ``ValueError`` for a
    wildcard (every interface would accept unsigned connection attempts from any
    network) or an address that is not a literal IPv4/IPv6 address."""
    try:
        parsed = ipaddress.ip_address(ip)
    except ValueError:
        raise ValueError(f"bind address {ip!r} is not an IP address; give the address of one "
                         "interface, e.g. '10.0.0.5'") from None
    if parsed.is_unspecified:
        raise ValueError(f"bind address {ip!r} listens on every interface; give one interface's "
                         "address (set MONARCH_NB_BIND=0.0.0.0 yourself if you really want that)")
    return ip
