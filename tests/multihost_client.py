"""The client side of tests/test_multihost.py, run in its own process: a fresh client
binds its inboxes on the interface that routes to the hub (the bridge), which a
process that already talked to a loopback cluster could not.

``python multihost_client.py NAME ROOT_IP NS_A NS_B`` starts cluster NAME with one host
agent in each network namespace, exercises it, stops it, and prints one JSON object
of what it saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from monarch_nb.allocators.command import CommandAllocator
from monarch_nb import cluster_dir
from monarch_nb.client.cluster import Cluster
from monarch_nb.wire import zap
from sample_actors import Arrays, AsyncCaller, Caller, Counter

# Run inside the other namespace: frame sets that a receiver must drop unread. Their
# header would create MARKER if anything unpickled it.
# First without the cluster's password: refused at the handshake (wire.zap), which it
# prints; then with it (read from stdin), as a peer that has it but not the key would.
SENDER = """
import pickle, sys, zmq
from zmq.utils.monitor import recv_monitor_message
address, cluster_id, marker = sys.argv[1], sys.argv[2].encode(), sys.argv[3]
class Touch:
    def __reduce__(self):
        return (open, (marker, "w"))
evil = pickle.dumps({"op": "spawn_actor", "x": Touch()})
ctx = zmq.Context.instance()
stranger = ctx.socket(zmq.PUSH)
monitor = stranger.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                      | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
stranger.connect(address)
stranger.send_multipart([b"MNB1" + bytes(32) + cluster_id, evil, evil])
print(zmq.Event(recv_monitor_message(monitor)["event"]).name if monitor.poll(60000) else "none")
stranger.close(0)
monitor.close(0)
sock = ctx.socket(zmq.PUSH)
sock.plain_username, sock.plain_password = cluster_id, sys.stdin.buffer.read()
# Queued only once connected (a send waits for that, 60 s at most: then this exits with an
# error), and all delivered before exit: on a loaded machine 5 s of linger once lost them.
sock.setsockopt(zmq.IMMEDIATE, 1)
sock.setsockopt(zmq.SNDTIMEO, 60000)
sock.connect(address)
sock.send_multipart([b"MNB1" + bytes(32) + cluster_id, evil, evil])  # forged signature
sock.send_multipart([b"MNB1" + bytes(32) + b"not-this-cluster", evil, evil])  # unknown cluster
sock.send_multipart([evil])  # no framing at all
sock.close(linger=60000)
ctx.term()
"""


def main() -> None:
    name, root_ip, ns_a, ns_b = sys.argv[1:5]
    seen: dict = {}
    cluster = Cluster.start(name, allocator=CommandAllocator(
        [["ip", "netns", "exec", ns_a], ["ip", "netns", "exec", ns_b]], bind=root_ip))
    try:
        info = cluster.info()
        seen["hub"] = cluster._info["hub"]
        seen["client_bind"] = os.environ.get("MONARCH_NB_BIND")
        seen["hosts"] = [h["address"] for h in info["hosts"]]
        seen["pids"] = [cluster._info["hub_pid"]] + [h["pid"] for h in info["hosts"]]

        procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 1}, name="p")
        counters = procs.spawn("counters", Counter, 10)
        seen["procs"] = [p["address"] for p in cluster.info()["proc_meshes"]["p"]["procs"]]
        seen["pids"] += procs.pids
        # client (root namespace) -> both hosts
        seen["incr"] = counters.incr.call(5).get(timeout=60).values()
        # an actor on host 0 holds the handle of the counter on host 1 and calls it
        caller = procs.slice(hosts=0).spawn("caller", Caller, counters.slice(hosts=1))
        seen["cross_call"] = caller.sum_of_other.call_one().get(timeout=60)
        async_caller = procs.slice(hosts=0).spawn("async_caller", AsyncCaller, counters.slice(hosts=1))
        seen["cross_call_async"] = async_caller.async_sum_of_other.call_one().get(timeout=60)

        # unsigned frames from host 1's namespace to an actor on host 0
        arrays = procs.slice(hosts=0).spawn("arrays", Arrays)
        target = cluster.info()["actor_meshes"]["p/arrays"]["addresses"][0]  # keyed PROC_MESH/NAME
        before = arrays.wire_stats.call_one().get(timeout=60)
        marker = os.path.join(tempfile.mkdtemp(), "unpickled")
        password = zap.password(cluster_dir.key_of(cluster._info))
        sent = subprocess.run(["ip", "netns", "exec", ns_b, sys.executable, "-c", SENDER, target,
                               cluster._info["cluster_id"], marker], input=password, capture_output=True,
                              timeout=150)
        seen["sender"] = sent.returncode, sent.stderr[-2000:].decode(errors="replace")
        seen["stranger"] = sent.stdout.decode().strip()
        deadline = time.monotonic() + 30
        while arrays.wire_stats.call_one().get(timeout=60) < before + 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # waiting for frames in flight to a process we can only ask
        seen["dropped"] = arrays.wire_stats.call_one().get(timeout=60) - before
        seen["unpickled"] = os.path.exists(marker)
        seen["after"] = counters.get.call().get(timeout=60).values()

        # Large values between hosts go ahead of their frame sets in chunks (wire.stream):
        # client -> host 0 and back, as an array and as bytes, and host 0 -> host 1.
        big = np.random.default_rng(5).integers(0, 256, (10 << 20) + 4097, np.uint8)
        back = arrays.echo.call_one(big).get(timeout=120)
        blob = big.tobytes()
        far = procs.slice(hosts=1).spawn("far_arrays", Arrays)
        relay = procs.slice(hosts=0).spawn("relay", Caller, far)
        seen["large"] = [bool(np.array_equal(back, big)), bool(back.flags.writeable),
                         arrays.echo.call_one(blob).get(timeout=120) == blob,
                         relay.echo_through_other.call_one(big).get(timeout=120) == big.nbytes]
        seen["large_dropped"] = arrays.wire_stats.call_one().get(timeout=60) - before - seen["dropped"]
        seen["listening"] = _listening(seen["pids"])
    finally:
        cluster.stop()
    print(json.dumps(seen))


def _listening(pids: list[int]) -> list[str]:
    """Every address the cluster's processes listen on (each in its own namespace)."""
    import psutil

    found = set()
    for pid in pids:
        for conn in psutil.Process(pid).net_connections("inet"):
            if conn.status == psutil.CONN_LISTEN:
                found.add(conn.laddr.ip)
    return sorted(found)


if __name__ == "__main__":
    main()
