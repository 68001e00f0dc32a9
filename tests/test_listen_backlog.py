"""Every inbox's accept queue is as long as the kernel allows (issue 24).

When all procs of a mesh answer at once (a call's replies, health()'s status replies) on a
loaded host, more SYNs can arrive than libzmq's default accept queue of 100 holds before
its I/O thread runs; Linux drops the rest and each of those peers waits for TCP's 1 s
retransmission. The kernel's own view of a listening socket (``ss``'s Send-Q) is checked,
so an option that never reached ``listen()`` fails too.
"""

from __future__ import annotations

import shutil
import subprocess

import zmq

from conftest import system_part_missing
from monarch_nb.wire import sockets


def _kernel_backlog(port: int) -> int:
    """The accept-queue length the kernel gives the socket listening on ``port``."""
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True,
                         check=True).stdout.split()
    return int(out[2])  # State Recv-Q Send-Q ...: Send-Q of a listener is its backlog


def test_an_inbox_listens_with_the_longest_accept_queue_the_kernel_allows():
    if shutil.which("ss") is None:
        system_part_missing("ss (iproute2) is not installed: cannot read a socket's backlog")
    with open("/proc/sys/net/core/somaxconn") as f:
        somaxconn = int(f.read())
    ctx = zmq.Context()
    try:
        inbox, address = sockets.bind_inbox(ctx)
        try:
            port = int(address.rsplit(":", 1)[1])
            # (libzmq's default of 100 dropped SYNs at ~128 procs)
            assert _kernel_backlog(port) == min(somaxconn, sockets.listen_backlog()) > 100
        finally:
            inbox.close(0)
    finally:
        ctx.term()
