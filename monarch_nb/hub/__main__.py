"""Entry point of the hub: ``python -m monarch_nb.hub`` (started by a client or the CLI)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from .. import cluster_dir, fd_limit, lifeline, notices
from ..wire import frames as wire_frames
from .server import Hub, HubError


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m monarch_nb.hub")
    parser.add_argument("--cluster-dir", required=True)
    parser.add_argument("--hosts", type=int, default=1)
    parser.add_argument("--ephemeral-parent", type=int, default=None,
                        help="pid of the client this ephemeral cluster lives and dies with")
    parser.add_argument("--detach", action="store_true",
                        help="fork into the background (a retained cluster's hub is nobody's child)")
    parser.add_argument("--grace", type=float, default=10.0,
                        help="seconds host agents keep procs after the hub falls silent")
    parser.add_argument("--idle-timeout", type=float, default=None,
                        help="stop the cluster after this many seconds without a connected client")
    parser.add_argument("--recover", action="store_true",
                        help="re-adopt the host agents and meshes of the cluster's state file")
    parser.add_argument("--allocator", type=json.loads, default=None,
                        help='the allocator spec as JSON, e.g. {"kind": "slurm", "nodes": 2} (default: local)')
    parser.add_argument("--ready-fd", type=int, default=None)
    args = parser.parse_args()
    notices.install()  # hub.log on a full disk must not fail what reports to it
    fd_limit.raise_soft_limit()  # a few descriptors per proc: the host agents it starts inherit it too
    if args.detach and os.fork() > 0:
        # The starting client reaps this short-lived parent; the hub carries on
        # re-parented, so it never becomes a zombie of a client that outlives it.
        os._exit(0)
    path = Path(args.cluster_dir)
    info = cluster_dir.read_info(path)
    wire_frames.register_key(info["cluster_id"], cluster_dir.key_of(info))
    if args.ephemeral_parent is not None:
        # SIGTERM starts an orderly shutdown of every host agent and proc.
        lifeline.die_with_parent(args.ephemeral_parent, signal.SIGTERM,
                                 on_orphan=lambda: os.kill(os.getpid(), signal.SIGTERM))

    async def run() -> None:
        hub = Hub(path, info, args.hosts, args.ephemeral_parent is not None, args.grace,
                  args.idle_timeout, args.recover, args.allocator)
        await hub.run(args.ready_fd)

    try:
        asyncio.run(run())
    except HubError as e:
        print(f"monarch_nb hub: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
