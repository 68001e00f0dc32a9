"""Entry point of a host agent: ``python -m monarch_nb.host`` (started by an allocator)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from .. import cluster_dir
from ..wire import frames as wire_frames
from .agent import HostAgent


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m monarch_nb.host")
    parser.add_argument("--cluster-dir", required=True)
    parser.add_argument("--hub", required=True, help="hub inbox address")
    parser.add_argument("--host-id", required=True)
    parser.add_argument("--grace", type=float, default=10.0,
                        help="seconds without hub heartbeats before stopping every proc")
    args = parser.parse_args()
    info = cluster_dir.read_info(Path(args.cluster_dir))
    wire_frames.register_key(info["cluster_id"], cluster_dir.key_of(info))

    async def run() -> None:
        agent = HostAgent(info["cluster_id"], args.cluster_dir, args.hub, args.host_id, args.grace)
        await agent.run()

    asyncio.run(run())


if __name__ == "__main__":
    main()
