"""Proc side of ``ProcMesh.setup_torch_distributed``: the ``torch_env_query`` and
``torch_env_set`` control ops.

Setting the torch elastic variables needs no torch, so this module never imports it:
a proc that never runs torch code never loads it (only a proc that sees a GPU loads it,
through ``gpus``, to say which CUDA device it would use). Whether a process group already
exists is read from ``sys.modules`` (if ``torch.distributed`` was never imported, no
group can exist).
"""

from __future__ import annotations

import os
import random
import socket
import sys

import psutil

from ..protocol import envelope, proc_ops
from ..protocol import gpus as gpus_proto
from . import gpus

# What torchrun sets for each worker and ``init_process_group(init_method="env://")``
# (the default) reads; GROUP_* is the host ("node") index and count.
ENV_KEYS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
            "GROUP_RANK", "GROUP_WORLD_SIZE")
# Which interface gloo and NCCL open their sockets on. Left to themselves they use the
# address the host name resolves to, which on many machines (Debian's 127.0.1.1, a
# management network) other hosts can't reach; the proc's own address they can.
IFNAME_KEYS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
REPORTED_KEYS = ENV_KEYS + IFNAME_KEYS


def free_port() -> int:
    """A TCP port free on every interface of this host right now, for rank 0's TCPStore
    (a gloo or NCCL group's, a TorchFT group's): one below the kernel's ephemeral range
    (``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default), so that no
    process's ``connect()`` or ``bind(port 0)`` is given it in the time until the store
    binds it, which a port the OS picked could be (CI saw a TorchFT manager's store fail
    with EADDRINUSE so). Where that range is unknown, or every try is taken, the OS picks."""
    low = _ephemeral_low()
    if low is not None and low > _UNASSIGNED_FROM + 1024:
        for port in random.Random().sample(range(_UNASSIGNED_FROM, low), _PORT_TRIES):
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# Where free_port looks below the ephemeral range: above the ports that well-known
# services (Jupyter's 8888, TensorBoard's 6006, ...) sit on; a listener found there is
# skipped, one started later may still collide, as with any picked port.
_UNASSIGNED_FROM = 20000
_PORT_TRIES = 32


def _ephemeral_low() -> int | None:
    """The first port of Linux's ephemeral range, or ``None`` where it can't be read."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(port: int) -> bool:
    """Whether a TCP listener could bind ``port`` on every interface now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore binds: TIME_WAIT is no obstacle
        try:
            s.bind(("", port))
        except OSError:
            return False
        return True


def interface_of(ip: str) -> str | None:
    """Name of this host's network interface that holds address ``ip`` (``"lo"`` for
    127.0.0.1), or ``None`` when none does."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == ip for a in addresses):
            return name
    return None


def process_group() -> dict | None:
    """This process's default torch process group as ``{"backend", "rank", "world_size"}``,
    or ``None`` when there is none (or torch was never imported)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return {"backend": str(dist.get_backend()), "rank": dist.get_rank(), "world_size": dist.get_world_size()}


def handle(header: dict) -> dict:
    """Serve one control op; returns the reply's header fields.

    ``torch_env_query`` (with ``free_port: bool``): ``{"group", "env", "picked_port"}``:
    ``env`` holds the current values of :data:`REPORTED_KEYS` (``None`` when unset),
    ``picked_port`` a free port when asked (not ``port``: replies are routed by it).
    ``torch_env_set`` (with ``env``: str -> str, and ``ip``: this proc's address) sets
    those variables in this process's environment, and :data:`IFNAME_KEYS` to the
    interface holding ``ip`` unless they are set already, then answers the same way.
    With ``protocol.gpus.CUDA`` (and ``LOCAL_RANK``) the reply also says which CUDA
    device this rank would use (``gpus.cuda_report``; torch is imported only where a
    GPU is visible); with ``DEVICE``, set makes it torch's current device."""
    if header[envelope.OP] == proc_ops.TORCH_ENV_SET:
        os.environ.update({k: str(v) for k, v in header["env"].items()})
        interface = interface_of(header["ip"]) if header.get("ip") else None
        for key in IFNAME_KEYS if interface else ():
            os.environ.setdefault(key, interface)
        if header.get(gpus_proto.DEVICE) is not None:
            gpus.set_device(header[gpus_proto.DEVICE])
    reply = {"group": process_group(), "env": {k: os.environ.get(k) for k in REPORTED_KEYS}}
    if header.get("free_port"):
        reply["picked_port"] = free_port()
    if header.get(gpus_proto.CUDA):
        reply[gpus_proto.CUDA] = gpus.cuda_report(header.get(gpus_proto.LOCAL_RANK) or 0)
    return reply
