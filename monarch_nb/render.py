"""Rich renderables for clusters, shared by the ``monarch-nb`` CLI and the magics."""

from __future__ import annotations

import time

from rich.table import Table

from . import health_view
from .protocol.states import DiscoveryState


def _uptime(started: float) -> str:
    seconds = int(time.time() - started)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _procs_alive(info: dict) -> tuple[int, int]:
    procs = [p for m in info["proc_meshes"].values() for p in m["procs"]]
    return sum(p["exit_code"] is None for p in procs), len(procs)


def clusters_table(clusters: list[dict]) -> Table:
    """One row per cluster of ``monarch_nb.list_clusters()``."""
    table = Table("name", "state", "hosts", "procs", "actor meshes", "clients", "uptime",
                  title="monarch_nb clusters", title_justify="left")
    for c in clusters:
        info = c["info"]
        if c["state"] != DiscoveryState.RUNNING:
            table.add_row(c["name"], f"[red]stale[/]: {c['reason']}", "", "", "", "", "")
            continue
        alive, total = _procs_alive(info)
        state = "[green]running[/]" + (" (ephemeral)" if c["ephemeral"] else "")
        table.add_row(c["name"], state, str(len(info["hosts"])), f"{alive}/{total}",
                      str(len(info["actor_meshes"])), str(len(info["clients"])), _uptime(info["started"]))
    if not clusters:
        table.caption = "no clusters; start one with `monarch-nb cluster start NAME`"
    return table


def status(info: dict, tree: dict | None = None, previous: dict | None = None) -> list:
    """A summary line and tables of hosts, meshes and clients for a hub's ``info``; with
    ``tree`` (a ``Cluster.health()`` answer; ``previous``: the one before, for CPU %),
    the health tree in place of the host and mesh tables."""
    if tree is not None:
        return [status_line(info), health_view.to_rich(tree, previous), _or_none(clients_table(info))]
    hosts = Table("host", "hostname", "agent pid", title="hosts", title_justify="left")
    for h in info["hosts"]:
        hosts.add_row(h["host_id"], h["hostname"], str(h["pid"]))
    procs = Table("proc mesh", "extent", "procs", "pids", title="proc meshes", title_justify="left")
    health = {}
    for m in info["proc_meshes"].values():
        health[m["name"]] = [p["exit_code"] for p in m["procs"]]
        procs.add_row(m["name"], health_view.extent_text(m["extent"]), _health(health[m["name"]]),
                      " ".join(str(p["pid"]) for p in m["procs"]))
    actors = Table("actor mesh", "class", "proc mesh", "extent", "actors", title="actor meshes",
                   title_justify="left")
    for m in info["actor_meshes"].values():
        codes = [health.get(m["proc_mesh"], [])[r] for r in m["proc_ranks"]]
        actors.add_row(m["name"], m["class_name"], m["proc_mesh"], health_view.extent_text(m["extent"]),
                       _health(codes))
    return [status_line(info)] + [_or_none(t) for t in (hosts, procs, actors, clients_table(info))]


def status_line(info: dict) -> str:
    """``cluster NAME running · up 3m02s · hub pid 123 · ...`` for a hub's ``info``."""
    alive, total = _procs_alive(info)
    idle = "never" if info["idle_timeout"] is None else f"{info['idle_timeout']:g} s without clients"
    return (f"cluster [bold]{info['name']}[/] [green]running[/] · up {_uptime(info['started'])} · "
            f"hub pid {info['hub_pid']} · {len(info['hosts'])} host(s) · {alive}/{total} procs alive · "
            f"grace {info['grace_s']:g} s · idle stop: {idle}")


def clients_table(info: dict) -> Table:
    clients = Table("client", "pid", "hostname", "connected", title="clients", title_justify="left")
    for c in info["clients"]:
        clients.add_row(c["label"], str(c["pid"]), c["hostname"], _uptime(c["connected"]) + " ago")
    return clients


def _or_none(table: Table):
    return table if table.row_count else f"[dim]no {table.title}[/]"


def _health(exit_codes: list) -> str:
    alive = sum(c is None for c in exit_codes)
    text = f"{alive}/{len(exit_codes)} healthy"
    if alive == len(exit_codes):
        return f"[green]{text}[/]"
    return f"[red]{text}[/] (exit codes {', '.join(str(c) for c in exit_codes if c is not None)})"
