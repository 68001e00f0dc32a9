"""Entry point of the hub: ``python -m monarch_nb.hub`` (started by a client or the CLI)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path

from .. import cluster_dir, lifeline
from ..wire import frames as wire_frames
from .server import Hub


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m monarch_nb.hub")
    parser.add_argument("--cluster-dir", required=True)
    parser.add_argument("--hosts", type=int, default=1)
    parser.add_argument("--ephemeral-parent", type=int, default=None,
                        help="pid of the client this ephemeral cluster lives and dies with")
    parser.add_argument("--grace", type=float, default=10.0,
                        help="seconds host agents keep procs after the hub falls silent")
    parser.add_argument("--ready-fd", type=int, default=None)
    args = parser.parse_args()
    path = Path(args.cluster_dir)
    info = cluster_dir.read_info(path)
    wire_frames.register_key(info["cluster_id"], cluster_dir.key_of(info))
    if args.ephemeral_parent is not None:
        # SIGTERM starts an orderly shutdown of every host agent and proc.
        lifeline.die_with_parent(args.ephemeral_parent, signal.SIGTERM,
                                 on_orphan=lambda: os.kill(os.getpid(), signal.SIGTERM))

    async def run() -> None:
        hub = Hub(path, info, args.hosts, args.ephemeral_parent is not None, args.grace)
        await hub.run(args.ready_fd)

    asyncio.run(run())


if __name__ == "__main__":
    main()
