"""``monarch-nb cluster start|stop|list|status|recover``: retained clusters from a terminal."""

from __future__ import annotations

import argparse
import time

from rich.console import Console

from . import render


def add_parser(sub) -> None:
    cluster = sub.add_parser("cluster", help="start, stop, list, inspect and recover retained clusters")
    verbs = cluster.add_subparsers(dest="verb", required=True)
    start = verbs.add_parser("start", help="start a retained cluster (or connect to it if it runs)")
    start.add_argument("name", nargs="?", default="default")
    start.add_argument("--hosts", type=int, default=None, help="local host agents (default 1)")
    start.add_argument("--grace", type=float, default=10.0,
                       help="seconds procs outlive a dead hub, waiting for `recover` (default 10)")
    start.add_argument("--idle-timeout", type=float, default=None,
                       help="stop after this many seconds without a connected client (default: never)")
    for verb, text in (("stop", "stop every process of a cluster and remove its files"),
                       ("status", "show a cluster's hosts, meshes and clients"),
                       ("recover", "start a new hub that re-adopts a cluster whose hub died")):
        verbs.add_parser(verb, help=text).add_argument("name", nargs="?", default="default")
    verbs.add_parser("list", help="list clusters with hosts, procs, meshes, uptime and clients")


def run(args: argparse.Namespace) -> int:
    """Carry out ``monarch-nb cluster VERB``; returns the exit status."""
    from .client import cluster as cluster_mod
    from .client import discovery
    from .errors import MonarchNbError

    console = Console()
    try:
        if args.verb == "list":
            console.print(render.clusters_table(cluster_mod.list_clusters()))
        elif args.verb == "start":
            t0 = time.monotonic()
            c = cluster_mod.Cluster.start(args.name, hosts=args.hosts, grace_s=args.grace,
                                          idle_timeout=args.idle_timeout)
            c.disconnect()
            console.print(f"cluster [bold]{args.name}[/] is running ({time.monotonic() - t0:.2f} s); "
                          f"connect with monarch_nb.connect({args.name!r})")
        elif args.verb == "recover":
            cluster_mod.Cluster.recover(args.name).disconnect()
            console.print(f"cluster [bold]{args.name}[/] recovered")
        elif args.verb == "stop":
            found = discovery.probe(args.name)
            if found.state == "missing":
                console.print(f"[red]no cluster named {args.name!r}[/]")
                return 1
            if found.state == "running":
                cluster_mod.Cluster(args.name, found.path, found.info).stop()
            else:
                discovery.remove_stale(found.path)
            console.print(f"cluster [bold]{args.name}[/] stopped")
        elif args.verb == "status":
            found = discovery.probe(args.name)
            if found.state != "running":
                why = found.reason or "it does not exist"
                console.print(f"[red]cluster {args.name!r} is not running: {why}[/]")
                return 1
            for part in render.status(found.hub_info):
                console.print(part)
    except MonarchNbError as e:
        console.print(f"[red]monarch-nb cluster {args.verb}: {e}[/]")
        return 1
    return 0
