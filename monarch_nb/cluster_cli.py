"""``monarch-nb cluster start|stop|list|status|recover``: retained clusters from a terminal."""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table


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
            console.print(_list_table(cluster_mod.list_clusters()))
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
            for part in _status(found.hub_info):
                console.print(part)
    except MonarchNbError as e:
        console.print(f"[red]monarch-nb cluster {args.verb}: {e}[/]")
        return 1
    return 0


def _uptime(started: float) -> str:
    seconds = int(time.time() - started)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _procs_alive(info: dict) -> tuple[int, int]:
    procs = [p for m in info["proc_meshes"].values() for p in m["procs"]]
    return sum(p["exit_code"] is None for p in procs), len(procs)


def _list_table(clusters: list[dict]) -> Table:
    table = Table("name", "state", "hosts", "procs", "actor meshes", "clients", "uptime",
                  title="monarch_nb clusters", title_justify="left")
    for c in clusters:
        info = c["info"]
        if c["state"] != "running":
            table.add_row(c["name"], f"[red]stale[/]: {c['reason']}", "", "", "", "", "")
            continue
        alive, total = _procs_alive(info)
        state = "[green]running[/]" + (" (ephemeral)" if c["ephemeral"] else "")
        table.add_row(c["name"], state, str(len(info["hosts"])), f"{alive}/{total}",
                      str(len(info["actor_meshes"])), str(len(info["clients"])), _uptime(info["started"]))
    if not clusters:
        table.caption = "no clusters; start one with `monarch-nb cluster start NAME`"
    return table


def _status(info: dict) -> list:
    alive, total = _procs_alive(info)
    idle = "never" if info["idle_timeout"] is None else f"{info['idle_timeout']:g} s without clients"
    summary = (f"cluster [bold]{info['name']}[/] [green]running[/] · up {_uptime(info['started'])} · "
               f"hub pid {info['hub_pid']} · {len(info['hosts'])} host(s) · {alive}/{total} procs alive · "
               f"grace {info['grace_s']:g} s · idle stop: {idle}")
    hosts = Table("host", "hostname", "agent pid", title="hosts", title_justify="left")
    for h in info["hosts"]:
        hosts.add_row(h["host_id"], h["hostname"], str(h["pid"]))
    procs = Table("proc mesh", "extent", "procs", "pids", title="proc meshes", title_justify="left")
    health = {}
    for m in info["proc_meshes"].values():
        health[m["name"]] = [p["exit_code"] for p in m["procs"]]
        procs.add_row(m["name"], _extent(m["extent"]), _health(health[m["name"]]),
                      " ".join(str(p["pid"]) for p in m["procs"]))
    actors = Table("actor mesh", "class", "proc mesh", "extent", "actors", title="actor meshes",
                   title_justify="left")
    for m in info["actor_meshes"].values():
        codes = [health.get(m["proc_mesh"], [])[r] for r in m["proc_ranks"]]
        actors.add_row(m["name"], m["class_name"], m["proc_mesh"], _extent(m["extent"]), _health(codes))
    clients = Table("client", "pid", "hostname", "connected", title="clients", title_justify="left")
    for c in info["clients"]:
        clients.add_row(c["label"], str(c["pid"]), c["hostname"], _uptime(c["connected"]) + " ago")
    return [summary] + [t if t.row_count else f"[dim]no {t.title}[/]" for t in (hosts, procs, actors, clients)]


def _extent(extent: dict) -> str:
    return " × ".join(f"{k}={v}" for k, v in extent.items())


def _health(exit_codes: list) -> str:
    alive = sum(c is None for c in exit_codes)
    text = f"{alive}/{len(exit_codes)} healthy"
    if alive == len(exit_codes):
        return f"[green]{text}[/]"
    return f"[red]{text}[/] (exit codes {', '.join(str(c) for c in exit_codes if c is not None)})"
