"""Two network namespaces joined to this one by veth pairs on a bridge: the multi-host
set-up that tests/test_multihost.py and bench/bench_multihost.py share (root and
iproute2 needed; see .ci/setup.d/10-netns.sh)."""

from __future__ import annotations

import ipaddress
import os
import subprocess
from contextlib import contextmanager


class NamespacesUnavailable(RuntimeError):
    """``ip link add`` failed: no iproute2, or no right to make links (not root)."""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@contextmanager
def bridged_namespaces(subnet: int, prefix: str):
    """A bridge at 10.SUBNET.N.1/24 here (N from this pid) and namespaces at .2 and .3,
    each link and namespace named from ``prefix`` and this pid; yields
    ``(root_ip, [ip_a, ip_b], [ns_a, ns_b])`` and removes all three after. Raises
    :class:`NamespacesUnavailable` (nothing made) when links can't be made, and
    ``RuntimeError`` when something is left behind."""
    tag = str(os.getpid() % 10_000_000)
    net = ipaddress.ip_network(f"10.{subnet}.{os.getpid() % 250}.0/24")
    root, a, b = (str(net[i]) for i in (1, 2, 3))
    bridge, spaces = f"{prefix}br{tag}", [f"{prefix}{tag}a", f"{prefix}{tag}b"]
    made: list[tuple[str, ...]] = []
    try:
        ip("link", "add", bridge, "type", "bridge")
    except (OSError, subprocess.CalledProcessError) as e:
        raise NamespacesUnavailable(f"`ip link add` failed ({getattr(e, 'stderr', '') or e})") from e
    try:
        made.append(("link", "del", bridge))
        ip("addr", "add", f"{root}/24", "dev", bridge)
        ip("link", "set", bridge, "up")
        for ns, addr in zip(spaces, (a, b)):
            ip("netns", "add", ns)
            made.append(("netns", "del", ns))
            outer, inner = f"{ns}0", f"{ns}1"
            ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            made.append(("link", "del", outer))
            ip("link", "set", inner, "netns", ns)
            ip("link", "set", outer, "master", bridge)
            ip("link", "set", outer, "up")
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", inner)
            ip("-n", ns, "link", "set", inner, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield root, [a, b], spaces
    finally:
        for undo in reversed(made):
            subprocess.run(["ip", *undo], capture_output=True, timeout=30)  # a veth goes with its namespace
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
        left = [n for n in spaces if n in names] + ([bridge] if bridge in links else [])
        if left:
            raise RuntimeError(f"network left behind: {left}")
