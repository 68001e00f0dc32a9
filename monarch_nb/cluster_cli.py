"""``monarch-nb cluster start|stop|list|status|recover``: retained clusters from a terminal."""

from __future__ import annotations

import argparse
import sys
import time

from rich.console import Console
from rich.markup import escape

from . import cluster_dir, config, render
from .allocators import slurm_options
from .protocol import hub_ops
from .protocol.states import DiscoveryState

FOLLOW_POLL_S = 0.5


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
    slurm_options.add_arguments(start)
    verbs.add_parser("stop", help="stop every process of a cluster and remove its files").add_argument(
        "name", nargs="?", default="default")
    recover = verbs.add_parser("recover", help="start a new hub that re-adopts a cluster whose hub died")
    recover.add_argument("name", nargs="?", default="default")
    recover.add_argument("--force", action="store_true",
                         help="kill its hub first if that still runs but does not answer")
    status = verbs.add_parser("status", help="show a cluster's health tree (hosts, procs, actors) and clients")
    status.add_argument("name", nargs="?", default="default")
    status.add_argument("-w", "--watch", action="store_true", help="keep refreshing it (Ctrl-C stops)")
    status.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    status.add_argument("--count", type=int, default=None, help="with --watch: stop after N refreshes")
    verbs.add_parser("list", help="list clusters with hosts, procs, meshes, uptime and clients")


def add_logs_parser(sub) -> None:
    logs = sub.add_parser("logs", help="show lines from a cluster's log store")
    logs.add_argument("name", nargs="?", default="default", help="cluster name")
    logs.add_argument("mesh", nargs="?", help="an actor or proc mesh")
    logs.add_argument("--ranks", default=None, help="e.g. 0-3,5")
    logs.add_argument("--tail", type=_lines, default=100, help="the last N lines shown (default 100)")
    logs.add_argument("--grep", default=None, help="a regular expression")
    logs.add_argument("--stream", choices=("stdout", "stderr"), default=None)
    logs.add_argument("--fold", choices=("on", "off"), default="on",
                      help="fold identical lines across ranks (default on; as %%monarch logs --fold)")
    logs.add_argument("--no-fold", dest="fold", action="store_const", const="off", help="the same as --fold off")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines (Ctrl-C stops)")


def _lines(text: str) -> int:
    """``--tail``'s value: a number of lines >= 1."""
    try:
        lines = int(text)
    except ValueError:
        lines = 0
    if lines < 1:
        raise argparse.ArgumentTypeError(f"give a number of lines >= 1, not {text}")
    return lines


def _kept_logs(args: argparse.Namespace, why_not_running: str) -> int:
    """``monarch-nb logs NAME`` for a cluster that is not running: its kept store, if any."""
    from .client import logs
    from .client.cluster import kept_logs
    from .errors import MonarchNbError
    from .mesh.ranks import parse_ranks
    from .protocol.records import LOG_FIELDS

    def fetch(tail: int) -> list[list]:
        records = kept_logs(args.name, mesh=args.mesh, ranks=parse_ranks(args.ranks) if args.ranks else None,
                            stream=args.stream, grep=args.grep, tail=tail)
        return [[r[f] for f in LOG_FIELDS] for r in records]

    try:
        lines = logs.tail_shown(fetch, args.tail, args.fold == "on")
    except MonarchNbError as e:
        print(f"monarch-nb logs: cluster {args.name!r} is not running ({why_not_running}) and {e}", file=sys.stderr)
        return 1
    print(f"monarch-nb logs: cluster {args.name!r} is stopped; the lines kept of it:", file=sys.stderr)
    logs.print_sink(lines)
    return 0


def run_logs(args: argparse.Namespace) -> int:
    """``monarch-nb logs NAME [MESH]``: print (and follow) stored lines."""
    from .client import discovery
    from .client import logs
    from .client.hub_client import HubClient
    from .errors import MonarchNbError
    from .mesh.ranks import parse_ranks, parse_ranks_of

    found = discovery.probe(args.name)
    if found.state != DiscoveryState.RUNNING:
        return _kept_logs(args, found.reason or "it does not exist")
    hub = HubClient(found.info["cluster_id"], found.info["hub"])
    try:
        ranks = parse_ranks(args.ranks) if args.ranks else None
        info = hub.request(hub_ops.INFO, timeout=30.0) if args.mesh is not None else None
        extent = None if info is None else logs.mesh_extent(info, args.mesh)
        if ranks is not None and extent is not None:  # as %%monarch exec --ranks checks them
            try:
                ranks = parse_ranks_of(args.ranks, args.mesh, extent)
            except ValueError as e:
                raise ValueError(f"mesh {args.mesh!r}: {e}") from None
        query = {"mesh": args.mesh, "ranks": ranks, "stream": args.stream, "grep": args.grep}
        records: list[list] = []

        def fetch(tail: int) -> list[list]:
            records[:] = hub.request(hub_ops.LOGS_QUERY, timeout=60.0, tail=tail, **query)["records"]
            return records

        lines = logs.tail_shown(fetch, args.tail, args.fold == "on")
        missing = None
        if not records and info is not None:
            missing = logs.no_such_mesh(info, args.mesh)
        if missing is not None and not args.follow:
            print(f"monarch-nb logs: cluster {args.name!r} has {missing}", file=sys.stderr)
            return 1
        if missing is not None:  # -f: its lines may come once a mesh of that name is made
            print(f"monarch-nb logs: cluster {args.name!r} has {missing}; following its lines to come "
                  "(Ctrl-C stops)", file=sys.stderr)
        last = records[-1][logs.SEQ] if records else 0
        while True:
            logs.print_sink(lines)
            if not args.follow:
                return 0
            time.sleep(FOLLOW_POLL_S)  # polling the store until Ctrl-C
            records = hub.request(hub_ops.LOGS_QUERY, timeout=60.0, after_seq=last, **query)["records"]
            if records:  # (a poll that found nothing keeps its place: asking after 0 printed everything again)
                last = records[-1][logs.SEQ]
            lines = logs.fold_records(records, args.fold == "on")
    except KeyboardInterrupt:
        return 0
    except (MonarchNbError, ValueError) as e:
        print(f"monarch-nb logs: {e}", file=sys.stderr)
        return 1


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
            allocator = slurm_options.allocator_from(args)
            if args.dry_run:  # the script on stdout, to save or diff; the note on stderr
                print(allocator.job_script(args.name), end="")
                print(f"monarch-nb: --dry-run: cluster {args.name!r} not started, nothing submitted", file=sys.stderr)
                return 0
            c = cluster_mod.Cluster.start(args.name, hosts=args.hosts, grace_s=args.grace,
                                          idle_timeout=args.idle_timeout, allocator=allocator)
            c.disconnect()
            where = slurm_options.describe(c._info)
            console.print(f"cluster [bold]{args.name}[/] is running{' on ' + where if where else ''} "
                          f"({time.monotonic() - t0:.2f} s); connect with monarch_nb.connect({args.name!r})")
        elif args.verb == "recover":
            recovered = cluster_mod.Cluster.recover(args.name, force=args.force)
            meshes = sorted(recovered.info()["proc_meshes"])
            recovered.disconnect()
            kept = (f"{len(meshes)} proc mesh(es) kept: {', '.join(meshes)}" if meshes else
                    "no proc mesh kept (every proc was gone: spawn them again)")
            console.print(f"cluster [bold]{args.name}[/] recovered; {kept}")
        elif args.verb == "stop":
            found = discovery.probe(args.name)
            if found.state == DiscoveryState.MISSING:
                console.print(f"[red]no cluster named {args.name!r}[/]")
                return 1
            if found.state == DiscoveryState.RUNNING:
                cluster_mod.Cluster(args.name, found.path, found.info).stop()
            else:
                # A cluster still starting: its starting client holds the lock until the
                # hub is up, so the hub is stopped first (its start then fails at once).
                discovery.stop_hub(found.info)
                with cluster_dir.locked(args.name):
                    discovery.remove_stale(found.path)
            console.print(f"cluster [bold]{args.name}[/] stopped")
        elif args.verb == "status":
            return _status(console, args)
    except (MonarchNbError, ValueError, TypeError) as e:
        console.print(f"[red]monarch-nb cluster {args.verb}: {escape(str(e))}[/]", soft_wrap=True)  # one line
        return 1
    return 0


def log_store_line(store: dict) -> str:
    """What ``cluster status`` says of the hub's log store: its size and its limits."""
    if not store.get("file"):
        return "log store: in memory only"
    limits = escape(f"keeps {store['max_bytes'] / 2**20:,.0f} MiB and {store['max_age_s'] / 86400:g} days "
                    f"([logs] max_mb, max_age_days in {config.path()})")
    state = "" if store["ok"] else f" [red]not writing: {escape(store['error'])}[/]"
    return (f"log store: {store['lines']:,} lines, {store['bytes'] / 2**20:,.1f} MiB in {store['file']}; "
            f"{limits}{state}")


def _status(console: Console, args: argparse.Namespace) -> int:
    """``monarch-nb cluster status NAME [--watch]``: the health tree, once or refreshed
    every ``--interval`` seconds (redrawn in place on a terminal, one frame after another
    otherwise) until Ctrl-C, ``--count`` frames, or the cluster stops."""
    from rich.console import Group
    from rich.live import Live

    from .client import discovery
    from .client.hub_client import HubClient
    from .errors import MonarchNbError

    if args.interval <= 0 or (args.count is not None and args.count < 1):
        console.print("[red]monarch-nb cluster status: --interval must be > 0 and --count >= 1[/]")
        return 1
    found = discovery.probe(args.name)
    if found.state != DiscoveryState.RUNNING:
        console.print(f"[red]cluster {args.name!r} is not running: {found.reason or 'it does not exist'}[/]")
        return 1
    hub = HubClient(found.info["cluster_id"], found.info["hub"])
    previous = None

    def frame() -> Group:
        nonlocal previous
        health = hub.request(hub_ops.HEALTH, timeout=30.0)
        info = hub.request(hub_ops.INFO, timeout=30.0)
        parts = render.status(info, health, previous)
        previous = health
        return Group(*parts, log_store_line(info["hub_stats"]["log_store"]))

    if not args.watch:
        console.print(frame())
        return 0
    live = Live(console=console, auto_refresh=False) if console.is_terminal else None
    frames = 0
    try:
        if live is not None:
            live.start()
        while args.count is None or frames < args.count:
            if frames:
                time.sleep(args.interval)  # a terminal view polls: it is no client, so hears no events
            try:
                shown = frame()
            except MonarchNbError as e:
                console.print(f"[red]cluster {args.name!r}: {e}[/]")
                return 1
            frames += 1
            if live is not None:
                live.update(shown, refresh=True)
            else:
                console.print(shown)
                console.print(f"[dim]── {time.strftime('%H:%M:%S')} · refresh {frames}[/]", highlight=False)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
    return 0
