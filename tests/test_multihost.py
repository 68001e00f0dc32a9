"""Multi-host without Slurm: two host agents in separate network namespaces, joined to
this machine's namespace (hub and client) by veth pairs on a bridge, form one cluster.
The namespaces, links and bridge are made by the test and removed after."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from monarch_nb import cluster_dir

from conftest import cluster_processes, system_part_missing, wait_until

TESTS = Path(__file__).parent


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def network():
    """A bridge at 10.213.N.1/24 in this namespace and two namespaces at .2 and .3."""
    tag = str(os.getpid() % 10_000_000)
    net = ipaddress.ip_network(f"10.213.{os.getpid() % 250}.0/24")
    root, a, b = (str(net[i]) for i in (1, 2, 3))
    bridge, spaces = f"mnbbr{tag}", [f"mnb{tag}a", f"mnb{tag}b"]
    made: list[tuple[str, ...]] = []
    try:
        ip("link", "add", bridge, "type", "bridge")
    except (OSError, subprocess.CalledProcessError) as e:  # no `ip`, or no right to make links (not root)
        system_part_missing(f"network namespaces: `ip link add` failed ({getattr(e, 'stderr', '') or e}); "
                            "run as root with iproute2 (`bash .ci/setup.d/10-netns.sh`)")
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
        yield {"root": root, "hosts": [a, b], "spaces": spaces}
    finally:
        for undo in reversed(made):
            subprocess.run(["ip", *undo], capture_output=True, timeout=30)  # a veth goes with its namespace
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
        assert not any(ns in names for ns in spaces) and bridge not in links, "network left behind"


def test_two_namespaced_host_agents_form_one_cluster_and_drop_unsigned_frames(network):
    name = f"multihost-{os.getpid()}"
    root, (a, b), (ns_a, ns_b) = network["root"], network["hosts"], network["spaces"]
    env = {k: v for k, v in os.environ.items() if k != "MONARCH_NB_BIND"}
    path = cluster_dir.cluster_path(name)
    try:
        out = subprocess.run([sys.executable, str(TESTS / "multihost_client.py"), name, root, ns_a, ns_b],
                             capture_output=True, text=True, timeout=240, cwd=TESTS, env=env)
    finally:  # a client that crashed or hung before its stop() must not leave the cluster running
        if path.exists():
            subprocess.run([sys.executable, "-m", "monarch_nb.cli", "cluster", "stop", name],
                           capture_output=True, timeout=60)
        assert wait_until(lambda: not cluster_processes(path), 10), cluster_processes(path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])

    # The hub, the client and each host bind on the interface their peers reach them on.
    assert seen["hub"].startswith(f"tcp://{root}:") and seen["client_bind"] == root
    assert [h.split("//")[1].split(":")[0] for h in seen["hosts"]] == [a, b]
    assert [p.split("//")[1].split(":")[0] for p in seen["procs"]] == [a, b]
    assert set(seen["listening"]) <= {root, a, b} and "0.0.0.0" not in seen["listening"], seen["listening"]

    # Calls cross the namespaces: client -> both hosts, an actor on one host -> the other.
    assert seen["incr"] == [15, 15]
    assert seen["cross_call"] == 15 and seen["cross_call_async"] == 15

    # Unsigned frames from the other namespace are dropped unread, and the actor works on.
    assert seen["sender"][0] == 0, seen["sender"]
    assert seen["dropped"] == 3 and not seen["unpickled"]
    assert seen["after"] == [15, 15]

    # cluster.stop() in the client ended every process in every namespace (checked above).
    assert not path.exists()
