"""A worker: a process started before any cluster, waiting at an address until a cluster
attaches to it (Monarch's ``run_worker_loop_forever`` / ``attach_to_workers``).

The worker holds no key, so it takes one request only, as JSON, naming a cluster
directory, a hub and a host id; it answers, then execs ``python -m monarch_nb.host`` for
that cluster, which reads the cluster's key from the directory (the worker must see it
at the same path: the same machine or a shared file system) and signs everything from
then on. So the worker serves one cluster and ends with it.

Addresses: ``ipc://PATH``, ``tcp://HOST:PORT``, ``tcp://HOST:fdN`` (serve on listening
socket N, inherited from the parent) and ``DIAL@BIND`` (bind BIND, e.g.
``tcp://0.0.0.0:PORT``, while clients dial DIAL).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys

import zmq

from ..protocol import worker_ops

# The largest request a waiting worker takes in (bytes; libzmq's MAXMSGSIZE, checked at a
# frame's announced length before anything is allocated): an attach request is a few
# hundred bytes of JSON, and anyone who can reach the worker may send one.
MAX_REQUEST_BYTES = 64 << 10

TRUST_ALL = "trust_all_connections"  # the only `ca` there is: no TLS, anyone who can connect may attach
_FD_ADDRESS = re.compile(r"tcp://(?P<host>[^:]+):fd(?P<fd>\d+)")


def dial_address(address: str) -> str:
    """Where clients connect to reach a worker listening at ``address``."""
    return address.split("@", 1)[0]


def check_ca(ca: str) -> None:
    if ca != TRUST_ALL:
        raise NotImplementedError(f"ca={ca!r}: monarch_nb workers have no TLS; pass ca={TRUST_ALL!r} (only on "
                                  "networks where anyone who can reach the worker may run code as it)")


def _bind(sock: zmq.Socket, address: str) -> None:
    bind = address.split("@", 1)[-1]
    inherited = _FD_ADDRESS.fullmatch(bind)
    if inherited is None:
        sock.bind(bind)
        return
    fd = int(inherited["fd"])
    listening = socket.socket(fileno=fd)
    port = listening.getsockname()[1]
    listening.listen()  # zmq accepts on a descriptor it is given, but does not listen on it
    listening.detach()  # zmq takes the descriptor over
    sock.setsockopt(zmq.USE_FD, fd)
    sock.bind(f"tcp://{inherited['host']}:{port}")


def _agent_argv(request: dict) -> list[str]:
    """The host agent's command line; ``ValueError`` for a malformed request."""
    fields = (worker_ops.CLUSTER_DIR, worker_ops.HUB, worker_ops.HOST_ID)
    if not all(isinstance(request.get(f), str) and request[f] for f in fields):
        raise ValueError(f"a worker request needs strings {', '.join(fields)}")
    grace = request.get(worker_ops.GRACE)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)):
        raise ValueError(f"a worker request needs a number {worker_ops.GRACE}")
    return [sys.executable, "-m", "monarch_nb.host", "--cluster-dir", request[worker_ops.CLUSTER_DIR],
            "--hub", request[worker_ops.HUB], "--host-id", request[worker_ops.HOST_ID], "--grace", str(grace)]


def run_worker_loop_forever(address: str, ca: str = TRUST_ALL) -> None:
    """Wait at ``address`` until a cluster attaches (``attach_to_workers``), then become
    its host agent on this machine; returns never (the process ends with the cluster).
    Malformed requests are answered with an error and the wait goes on. Raises
    ``NotImplementedError`` for a ``ca`` other than ``"trust_all_connections"``."""
    check_ca(ca)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)  # (a larger one closes its connection unread)
    _bind(sock, address)
    while True:
        try:
            argv = _agent_argv(json.loads(sock.recv()))
        except ValueError as e:  # (json's errors are ValueErrors too)
            sock.send(json.dumps({worker_ops.ERROR: str(e)}).encode())
            continue
        sock.send(json.dumps({worker_ops.PID: os.getpid(), worker_ops.HOSTNAME: socket.gethostname()}).encode())
        break
    sock.close(linger=1000)  # the reply goes out before the exec
    ctx.term()
    os.execv(argv[0], argv)
