"""Workers allocator: host agents are workers that were waiting before the cluster
started (``run_worker_loop_forever``; see :mod:`monarch_nb.host.worker`), one per host,
in the order their addresses are given. ``start`` asks each to become this cluster's
host agent; the agents then report to the hub like any other. A worker on this machine
is watched through its pid; others through the hub's heartbeats.
"""

from __future__ import annotations

import json
import socket

import psutil
import zmq

from ..host.worker import dial_address
from ..protocol import worker_ops
from ..wire import sockets
from .local import LocalAllocator

ATTACH_TIMEOUT_S = 10.0  # for a worker to answer the attach request


class WorkersAllocator(LocalAllocator):
    kind = "workers"

    def __init__(self, workers: list[str], cluster_dir: str = "", grace_s: float = 10.0):
        if not workers or not all(isinstance(w, str) and "://" in w for w in workers):
            raise ValueError(f"workers={workers!r}: give the workers' addresses, e.g. ['tcp://10.0.0.7:26600']")
        super().__init__(cluster_dir, grace_s)
        self.workers = list(workers)

    @property
    def hosts(self) -> int:
        return len(self.workers)

    @classmethod
    def from_spec(cls, spec: dict, cluster_dir: str, grace_s: float) -> "WorkersAllocator":
        return cls(spec["workers"], cluster_dir, grace_s)

    def spec(self) -> dict:
        return {"kind": self.kind, "workers": self.workers}

    def start(self, hub_address: str, hosts: int) -> list[str]:
        """Attach every worker, in order; raises ``RuntimeError`` naming a worker that
        did not answer within ``ATTACH_TIMEOUT_S`` or refused."""
        ids = []
        ctx: zmq.Context = sockets.context()
        for address in self.workers:
            if self._cancelled.is_set():
                break
            host_id = self._next_id()
            reply = _ask(ctx, dial_address(address), {
                worker_ops.CLUSTER_DIR: self.cluster_dir, worker_ops.HUB: hub_address,
                worker_ops.HOST_ID: host_id, worker_ops.GRACE: self.grace_s})
            if worker_ops.ERROR in reply:
                raise RuntimeError(f"worker {address} refused to attach: {reply[worker_ops.ERROR]}")
            if reply.get(worker_ops.HOSTNAME) == socket.gethostname():
                try:
                    self.agents[host_id] = psutil.Process(reply[worker_ops.PID])
                except psutil.NoSuchProcess:
                    pass  # exited already: the hub finds out when it does not report
            ids.append(host_id)
        self.host_ids += ids
        return ids


def _ask(ctx: zmq.Context, address: str, request: dict) -> dict:
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        sock.send(json.dumps(request).encode())
        if not sock.poll(int(ATTACH_TIMEOUT_S * 1000)):
            raise RuntimeError(f"worker {address} did not answer within {ATTACH_TIMEOUT_S} s; is it running "
                               "run_worker_loop_forever() at that address, and not attached to another cluster?")
        return json.loads(sock.recv())
    finally:
        sock.close()
