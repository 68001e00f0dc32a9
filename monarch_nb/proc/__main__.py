"""Entry point of a proc: ``python -m monarch_nb.proc`` (started by a host agent)."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

from .. import cluster_dir, lifeline
from ..wire import frames as wire_frames
from . import stdio
from .server import ProcServer


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m monarch_nb.proc")
    parser.add_argument("--cluster-dir", required=True)
    parser.add_argument("--agent", required=True, help="host agent inbox address")
    parser.add_argument("--proc-id", required=True)
    parser.add_argument("--ppid", type=int, required=True)
    args = parser.parse_args()

    # A proc never outlives its host agent.
    lifeline.die_with_parent(args.ppid, signal.SIGKILL)
    info = cluster_dir.read_info(Path(args.cluster_dir))
    cluster_id = info["cluster_id"]
    wire_frames.register_key(cluster_id, cluster_dir.key_of(info))

    stdio.install()
    server = ProcServer(cluster_id, args.proc_id)
    # SIGINT (`%monarch interrupt`, Ctrl-C in the notebook) interrupts the endpoints
    # running in actor threads; the proc itself carries on.
    signal.signal(signal.SIGINT, lambda *_: server.interrupt())
    server.outbox.send(args.agent, wire_frames.encode(
        cluster_id, {"op": "proc_ready", "proc_id": args.proc_id, "address": server.address, "pid": os.getpid()}))
    server.serve()
    # Actor threads may be busy in user code; exit without waiting for them.
    stdio.flush_all()
    os._exit(0)


if __name__ == "__main__":
    main()
