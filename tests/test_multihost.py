"""Multi-host without Slurm: two host agents in separate network namespaces, joined to
this machine's namespace (hub and client) by veth pairs on a bridge, form one cluster.
The namespaces, links and bridge are made by the test and removed after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from monarch_nb import cluster_dir

from conftest import cluster_processes, system_part_missing, wait_until
from netns import NamespacesUnavailable, bridged_namespaces

TESTS = Path(__file__).parent


@pytest.fixture
def network():
    """A bridge at 10.213.N.1/24 in this namespace and two namespaces at .2 and .3."""
    try:
        context = bridged_namespaces(213, "mnb")
        root, hosts, spaces = context.__enter__()
    except NamespacesUnavailable as e:
        system_part_missing(f"network namespaces: {e}; run as root with iproute2 (`bash .ci/setup.d/10-netns.sh`)")
    try:
        yield {"root": root, "hosts": hosts, "spaces": spaces}
    finally:
        context.__exit__(None, None, None)


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

    # A peer in the other namespace without the cluster's password is refused at the
    # handshake (wire.zap); one with it but no key has its frame sets dropped unread.
    assert seen["stranger"].startswith("HANDSHAKE_FAILED"), seen["stranger"]
    assert seen["sender"][0] == 0, seen["sender"]
    assert seen["dropped"] == 3 and not seen["unpickled"]
    assert seen["after"] == [15, 15]

    # Large values cross the namespaces intact, both ways and actor to actor, none dropped.
    assert seen["large"] == [True, True, True, True] and seen["large_dropped"] == 0

    # cluster.stop() in the client ended every process in every namespace (checked above).
    assert not path.exists()
