"""Entry point of a host agent: ``python -m monarch_nb.host`` (started by an allocator)."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
from pathlib import Path

from .. import cluster_dir, fd_limit, notices
from ..wire import frames as wire_frames
from ..wire import interfaces
from .agent import HostAgent


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m monarch_nb.host")
    parser.add_argument("--cluster-dir", required=True)
    parser.add_argument("--hub", required=True, help="hub inbox address")
    parser.add_argument("--host-id", required=True)
    parser.add_argument("--grace", type=float, default=10.0,
                        help="seconds without hub heartbeats before stopping every proc")
    parser.add_argument("--bind", default=None,
                        help="interface this agent and its procs bind on: an IP, or 'auto' for the one "
                             "that routes to the hub (default: MONARCH_NB_BIND, else loopback)")
    parser.add_argument("--node", default="", help="the allocator's name for this host (e.g. a Slurm node)")
    args = parser.parse_args()
    notices.install()  # its stderr is hub.log: a full disk must not end its heartbeat
    fd_limit.raise_soft_limit()  # a few descriptors per proc (its procs inherit the limit)
    if args.bind:
        # Through the environment, so that the procs this agent starts bind there too.
        ip = interfaces.route_source(interfaces.host_of(args.hub)) if args.bind == "auto" else args.bind
        os.environ["MONARCH_NB_BIND"] = interfaces.check_bind_address(ip)
    info = cluster_dir.read_info(Path(args.cluster_dir))
    wire_frames.register_key(info["cluster_id"], cluster_dir.key_of(info))

    async def run() -> None:
        agent = HostAgent(info["cluster_id"], args.cluster_dir, args.hub, args.host_id, args.grace, args.node,
                          hub_pid=info.get("hub_pid") if info.get("hostname") == socket.gethostname() else None)
        await agent.run()

    asyncio.run(run())


if __name__ == "__main__":
    main()
