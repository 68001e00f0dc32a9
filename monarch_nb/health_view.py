"""The health tree (``Cluster.health()``) made readable: nodes with a one-line label and a
state colour, rendered as plain text, HTML or a rich tree. Pure: no I/O, no IPython;
the notebook widget (``notebook/health_widget.py``), the ``%monarch status`` magic and
``monarch-nb cluster status`` all draw from here.

Every node has a stable key, used as ``data-mnb-node`` in the HTML (its state is
``data-mnb-state``), so a browser test or a user's script can find it:

- ``host:HOST_ID`` (state ``healthy``/``lost``)
- ``proc:MESH/RANK`` (a proc of proc mesh MESH; ``healthy``, ``busy``, ``paused``,
  ``unresponsive``, ``failed``, ``lost``), and its actors ``actor:MESH/RANK`` (of actor
  mesh MESH)
- ``mesh:NAME`` (an actor mesh) and its actors ``mesh:NAME/RANK``
- ``starting:NAME`` (a proc mesh being spawned)
- ``service:NAME`` (a service) and its replicas ``service:NAME/IDX``
- ``section:hosts``, ``section:actor_meshes``, ``section:services``: the top levels (the
  last only when the cluster has services)
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from .proc import exec_actor
from .protocol.gpus import GPU_USED_BYTES
from .protocol.states import AT_WORK, DOWN, STATE, HealthState

# One colour per state: CSS for HTML and the widget, rich style names for terminals.
STATE_COLOURS: dict[str, tuple[str, str]] = {
    HealthState.HEALTHY: ("#2e7d32", "green"),
    HealthState.BUSY: ("#1565c0", "blue"),
    HealthState.PAUSED: ("#e65100", "dark_orange"),
    HealthState.STARTING: ("#00838f", "cyan"),
    HealthState.UNRESPONSIVE: ("#b8860b", "yellow"),
    HealthState.FAILED: ("#c62828", "red"),
    HealthState.LOST: ("#c62828", "red"),
    HealthState.DEGRADED: ("#e65100", "dark_orange"),
    HealthState.STOPPED: ("#757575", "grey50"),
}
OPEN_PROCS_UP_TO = 8  # with this many procs or fewer, their actors show at first
OPEN_HOSTS_UP_TO = 4  # with more hosts, each opens on a click: the tree starts as one line per host

# Glyphs Debian's default fonts have (DejaVu): "⏸" (U+23F8) showed as an empty box.
STATE_MARKS: dict[str, str] = {HealthState.HEALTHY: "●", HealthState.BUSY: "◐", HealthState.PAUSED: "‖",
               HealthState.STARTING: "◌", HealthState.UNRESPONSIVE: "?", HealthState.FAILED: "✗",
               HealthState.LOST: "✗", HealthState.DEGRADED: "◐", HealthState.STOPPED: "■"}


@dataclass
class Node:
    """One line of the tree: ``title`` (a name) then ``text`` (state and figures);
    ``cause`` says why a failed/lost node failed. ``kind``: section, host, proc, actor,
    mesh or starting. ``open``: shown expanded at first."""

    key: str
    kind: str
    state: str
    title: str
    text: str = ""
    cause: str | None = None
    children: list["Node"] = field(default_factory=list)
    open: bool = False


# formatting ---------------------------------------------------------------------------
def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """``0.4 s``, ``42 s``, ``12m03s``, ``3h07m``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def extent_text(extent: dict) -> str:
    """``hosts=2 × gpus=8``; ``no dimensions`` for a mesh of one element over ``{}``."""
    return " × ".join(f"{k}={v}" for k, v in extent.items()) or "no dimensions"


def cpu_percent(previous: dict | None, tree: dict) -> dict[str, float]:
    """CPU use of each live proc between two health trees of one cluster, in percent of
    one core: proc id -> percent (only procs in both, same pid, clock moved on)."""
    if not previous:
        return {}
    before = {p["proc_id"]: p for h in previous["hosts"] for p in h["procs"]}
    found = {}
    for host in tree["hosts"]:
        for proc in host["procs"]:
            old = before.get(proc["proc_id"])
            if (old and old["pid"] == proc["pid"] and "cpu_s" in proc and "cpu_s" in old
                    and proc.get("uptime_s", 0) > old.get("uptime_s", 0)):
                found[proc["proc_id"]] = max(0.0, 100 * (proc["cpu_s"] - old["cpu_s"])
                                             / (proc["uptime_s"] - old["uptime_s"]))
    return found


# the tree of nodes --------------------------------------------------------------------
def gpus_text(gpus: list[dict], used: dict[str, int] | None = None) -> str:
    """A proc's GPUs for its line, compact: ``"GPU 3 · H100 80GB HBM3 · 12.1 GiB used"``
    (index on its host; model without its vendor; memory the proc uses there, when
    known: ``used`` is GPU id -> bytes); several: ``"GPUs 3, 5 · H100 · 20.0 GiB used"``
    (memory summed). The id ``CUDA_VISIBLE_DEVICES`` names a GPU by stands for its
    index when that is unknown."""
    labels = [str(g["index"]) if g.get("index") is not None else g["id"] for g in gpus]
    parts = [("GPU " if len(gpus) == 1 else "GPUs ") + ", ".join(labels)]
    names = list(dict.fromkeys(g["name"].removeprefix("NVIDIA ") for g in gpus if g.get("name")))
    if names:
        parts.append(" / ".join(names))
    figures = [used[g["id"]] for g in gpus if used and g["id"] in used]
    if figures:
        parts.append(f"{format_bytes(sum(figures))} used")
    return " · ".join(parts)


def _actor_text(actor: dict, with_class: bool) -> str:
    parts = [actor["class"]] if with_class else []
    state = actor[STATE]
    if state == HealthState.BUSY:
        parts.append(f"busy: {actor['endpoint']} for {format_duration(actor['busy_s'])}")
    elif state == HealthState.PAUSED:
        where = ":".join(str(actor[k]) for k in ("file", "line") if actor.get(k) is not None)
        what = f" in {actor['function']}" if actor.get("function") else ""
        since = f" for {format_duration(actor['paused_s'])}" if "paused_s" in actor else ""
        parts.append(f"paused in the debugger{' at ' + where if where else ''}{what}{since}")
    elif actor.get("died"):  # dead while its proc lives
        parts.append(f"{state}: {actor['died']}")
    else:
        parts.append(state)
    return " · ".join(parts)


def _actor_node(key: str, actor: dict, with_class: bool) -> Node:
    return Node(key, "actor", actor[STATE], f"{actor['mesh']}[{actor['rank']}]", _actor_text(actor, with_class),
                actor.get("died"))


def _proc_node(proc: dict, cpu: dict[str, float], open_: bool) -> Node:
    state = proc[STATE]
    doing = next((a for a in proc["actors"] if a[STATE] == state), None)
    if proc.get("cause") is not None:
        parts = [f"{state}: {proc['cause']}"]
    elif state == HealthState.BUSY and doing is not None:  # what keeps it busy, seen even while it is closed
        parts = [f"busy: {doing['mesh']}.{doing['endpoint']} for {format_duration(doing['busy_s'])}"]
    elif state == HealthState.PAUSED and doing is not None:
        parts = [f"{_actor_text(doing, False)} ({doing['mesh']})"]
    else:
        parts = [state]
    parts.append(f"pid {proc['pid']}")
    if proc.get("gpus"):
        parts.append(gpus_text(proc["gpus"], proc.get(GPU_USED_BYTES)))
    if state not in (*DOWN, HealthState.STOPPED):
        if "uptime_s" in proc:
            parts.append(f"up {format_duration(proc['uptime_s'])}")
        if "rss_bytes" in proc:
            parts.append(format_bytes(proc["rss_bytes"]))
        if proc["proc_id"] in cpu:
            parts.append(f"CPU {cpu[proc['proc_id']]:.0f}%")
        elif "cpu_s" in proc:
            parts.append(f"CPU time {proc['cpu_s']:.1f} s")
    actors = [_actor_node(f"actor:{a['mesh']}/{a['rank']}", a, True) for a in proc["actors"]]
    return Node(f"proc:{proc['proc_id']}", "proc", state, proc["proc_id"], " · ".join(parts), proc.get("cause"),
                actors, open=open_)


def _internal(mesh: str) -> bool:
    """An actor mesh of monarch_nb's own machinery (``%%monarch exec``'s)."""
    return mesh.endswith(exec_actor.MESH_SUFFIX)


def _without_internal(tree: dict) -> dict:
    hosts = [{**h, "procs": [{**p, "actors": [a for a in p["actors"] if not _internal(a["mesh"])]}
                             for p in h["procs"]]} for h in tree["hosts"]]
    return {**tree, "hosts": hosts, "actor_meshes": [m for m in tree["actor_meshes"] if not _internal(m["name"])]}


def nodes(tree: dict, previous: dict | None = None, internal: bool = False) -> list[Node]:
    """The two top levels of ``tree`` (a ``Cluster.health()`` answer): hosts -> procs ->
    actors, then actor meshes -> actors. ``previous`` (the tree before) gives CPU %.
    ``internal``: show monarch_nb's own actor meshes too (``P.exec``, hidden by default)."""
    if not internal:
        tree = _without_internal(tree)
    cpu = cpu_percent(previous, tree)
    few = sum(len(h["procs"]) for h in tree["hosts"]) <= OPEN_PROCS_UP_TO
    hosts = []
    for host in tree["hosts"]:
        procs = [_proc_node(p, cpu, few) for p in host["procs"]]
        cause = host.get("cause") or ("its host agent stopped answering" if host[STATE] == HealthState.LOST else None)
        where = host["hostname"] + (f" (node {host['node']})" if host.get("node") and host["node"] != host["hostname"]
                                    else "")
        text = f"{host['state']}{': ' + cause if cause else ''} · {where} · agent pid {host['pid']} · {len(procs)} procs"
        if host.get("gpus"):
            text += f" · {len(host['gpus'])} GPUs"
        hosts.append(Node(f"host:{host['host_id']}", "host", host[STATE], host["host_id"], text, cause, procs,
                          open=len(tree["hosts"]) <= OPEN_HOSTS_UP_TO))
    for starting in tree.get("starting", []):
        hosts.append(Node(f"starting:{starting['proc_mesh']}", "starting", HealthState.STARTING,
                          starting["proc_mesh"],
                          f"starting: {starting['up']}/{starting['total']} procs up"))
    meshes = []
    for mesh in tree["actor_meshes"]:
        text = (f"{mesh['class']} · on {mesh['proc_mesh']} · {extent_text(mesh['extent'])} · "
                f"{mesh['alive']}/{mesh['size']} healthy")
        if mesh[STATE] not in (HealthState.HEALTHY, HealthState.FAILED):
            text += f" · {mesh['state']}"
        actors = [_actor_node(f"mesh:{mesh['name']}/{a['rank']}", a, False) for a in mesh["actors"]]
        meshes.append(Node(f"mesh:{mesh['name']}", "mesh", mesh[STATE], mesh["name"], text, None, actors))
    top = [Node("section:hosts", "section", "", f"hosts ({len(tree['hosts'])})", children=hosts, open=True),
           Node("section:actor_meshes", "section", "", f"actor meshes ({len(meshes)})", children=meshes, open=True)]
    services = [service_node(s) for s in tree.get("services", ())]
    if services:
        top.append(Node("section:services", "section", "", f"services ({len(services)})", children=services,
                        open=True))
    return top


# services -----------------------------------------------------------------------------
# A replica's state as the client that routes to it says it (``service.ReplicaState``),
# in the tree's colours; without that client, the state of its procs (the hub's view).
# Keyed by ``ReplicaState``'s words, not its members: this module is drawn by the CLI,
# which should not import the service package (and the client beneath it) to colour a line.
REPLICA_STATES = {"healthy": HealthState.HEALTHY, "initializing": HealthState.STARTING,
                  "recovering": HealthState.STARTING, "unhealthy": HealthState.FAILED, "stopped": HealthState.STOPPED}


def replica_state(replica: dict) -> str:
    """The tree state of a replica node of ``Cluster.health()["services"]``."""
    mine = replica.get("service_state")
    return REPLICA_STATES.get(mine, replica[STATE]) if mine else replica[STATE]


def replica_text(replica: dict) -> str:
    """``recovering · on policy-1a2b3c-r2g2 · pid 812 · 120 requests · 2 in flight · p50
    1.20 ms · p99 3.40 ms · 1 restart`` (the load only from the client that routes)."""
    parts = [replica.get("service_state") or replica[STATE]]
    if replica.get("cause"):
        parts[0] += f": {replica['cause']}"
    if replica.get("proc_mesh"):
        parts.append(f"on {replica['proc_mesh']}")
    if replica.get("pids"):
        parts.append(("pid " if len(replica["pids"]) == 1 else "pids ") + " ".join(map(str, replica["pids"])))
    if "requests" in replica:
        parts += [f"{replica['requests']} requests", f"{replica['in_flight']} in flight",
                  f"p50 {replica['latency_p50_s'] * 1e3:.2f} ms", f"p99 {replica['latency_p99_s'] * 1e3:.2f} ms",
                  f"{replica['restarts']} restart{'' if replica['restarts'] == 1 else 's'}"]
    return " · ".join(parts)


def service_node(service: dict) -> Node:
    """A service of ``Cluster.health()["services"]`` and its replicas."""
    replicas = [Node(f"service:{service['name']}/{r['replica']}", "replica", replica_state(r), f"replica {r['replica']}",
                     replica_text(r), r.get("cause")) for r in service["replicas"]]
    states = [r.state for r in replicas]
    up = sum(s in (HealthState.HEALTHY, *AT_WORK) for s in states)
    state = (HealthState.HEALTHY if up == len(states) else HealthState.STOPPED if set(states) == {HealthState.STOPPED}
             else HealthState.FAILED if up == 0 and HealthState.STARTING not in states
             else HealthState.STARTING if HealthState.STARTING in states else HealthState.DEGRADED)
    text = f"{service['class'].rpartition('.')[2]} · {up}/{len(states)} replicas serving"
    if not service.get("routed_here"):
        text += " · routed by another client (cluster.services[NAME] here routes from this one)"
    return Node(f"service:{service['name']}", "service", state, service["name"], text, None, replicas, open=True)


def service_text(service: dict) -> str:
    """``%monarch service NAME``: the service's line, then one row per replica (state,
    requests, in flight, p50/p99 in ms, restarts, where; ``-`` for what only the client
    that routes knows)."""
    node = service_node(service)
    rows = [f"service {service['name']} · {node.text}",
            f"{'replica':>7}  {'state':<12} {'requests':>8} {'in flight':>9} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'restarts':>8}  procs"]
    for r in service["replicas"]:
        known = "requests" in r

        def num(key: str, scale: float = 1, fmt: str = "d") -> str:
            return format(r[key] * scale if scale != 1 else r[key], fmt) if known else "-"

        where = f"{r.get('proc_mesh') or '-'} (pids {' '.join(map(str, r.get('pids') or [])) or '-'})"
        rows.append(f"{r['replica']:>7}  {r.get('service_state') or r[STATE]:<12} {num('requests'):>8} "
                    f"{num('in_flight'):>9} {num('latency_p50_s', 1e3, '.2f'):>8} {num('latency_p99_s', 1e3, '.2f'):>8} "
                    f"{num('restarts'):>8}  {where}")
        if r.get("cause"):
            rows.append(f"{'':>9}{r['cause']}")
    return "\n".join(rows)


def summary_parts(tree: dict) -> list[tuple[str, str]]:
    """The summary line in parts, each with the state that colours it ('' for none):
    ``[("8/8 procs healthy", "healthy"), ("1 paused", "paused"), ("0 failed", "")]``."""
    if tree[STATE] == HealthState.STOPPED:
        return [(tree["summary"], HealthState.STOPPED)]
    parts = []
    for part in tree["summary"].split(" · "):
        count, _, word = part.partition(" ")
        state: str
        if "procs healthy" in part:
            state = HealthState.HEALTHY if tree[STATE] == HealthState.HEALTHY else HealthState.DEGRADED
        elif word == HealthState.FAILED:
            state = HealthState.FAILED if count != "0" else ""
        elif HealthState.STARTING in part:
            state = HealthState.STARTING
        elif part.endswith("refused"):  # another user's connections to a debugger relay
            state = HealthState.FAILED
        else:
            state = word if word in STATE_COLOURS else ""
        parts.append((part, state))
    return parts


def as_stopped(tree: dict) -> dict:
    """A copy of ``tree`` with every host, proc, actor and mesh ``stopped``: what a
    display shows once the cluster was stopped."""
    def actors(nodes_: list) -> list:
        return [{**a, STATE: HealthState.STOPPED} for a in nodes_]

    stopped = HealthState.STOPPED
    hosts = [{**h, STATE: stopped, "procs": [{**p, STATE: stopped, "cause": None, "actors": actors(p["actors"])}
                                             for p in h["procs"]]} for h in tree["hosts"]]
    meshes = [{**m, STATE: stopped, "alive": 0, "actors": actors(m["actors"])} for m in tree["actor_meshes"]]
    services = [{**s, "replicas": [{**r, STATE: stopped, "service_state": None, "cause": None}
                                   for r in s["replicas"]]} for s in tree.get("services", ())]
    return {**tree, STATE: stopped, "summary": stopped.value, "hosts": hosts, "actor_meshes": meshes,
            "starting": [], "services": services}


# plain text ---------------------------------------------------------------------------
def _line(node: Node) -> str:
    mark = STATE_MARKS.get(node.state, "")
    return f"{mark + ' ' if mark else ''}{node.title}" + (f"  {node.text}" if node.text else "")


def to_plain(tree: dict, previous: dict | None = None, note: str | None = None) -> str:
    """The tree as indented text: a summary line (``note`` after it in parentheses),
    then every host, proc and actor, then every actor mesh with its actors that are not
    healthy."""
    lines = [f"cluster {tree['cluster']} · {tree['summary']}" + (f" ({note})" if note else "")]

    def walk(node: Node, depth: int) -> None:
        lines.append("  " * depth + _line(node))
        for child in node.children:
            if node.key.startswith("mesh:") and child.state == HealthState.HEALTHY:
                continue  # the hosts part lists every actor already
            walk(child, depth + 1)

    for top in nodes(tree, previous):
        walk(top, 0)
    return "\n".join(lines)


# HTML -----------------------------------------------------------------------------------
def _coloured(text: str, state: str) -> str:
    colour = STATE_COLOURS.get(state, (None,))[0]
    return f'<span style="color:{colour}">{html.escape(text)}</span>' if colour else html.escape(text)


def summary_html(tree: dict, note: str | None = None) -> str:
    """``cluster NAME · 8/8 procs healthy · 1 paused · 0 failed`` with colours; ``note``
    (e.g. why live updates stopped) is appended in grey."""
    parts = " · ".join(_coloured(text, state) for text, state in summary_parts(tree))
    extra = f' <span style="color:#757575">({html.escape(note)})</span>' if note else ""
    return (f'<span class="mnb-summary" data-mnb-node="cluster" data-mnb-state="{tree[STATE]}">'
            f"cluster <b>{html.escape(tree['cluster'])}</b> · {parts}{extra}</span>")


def label_html(node: Node) -> str:
    """One node's line: state mark and title in the state's colour, then its text; a
    failed node's cause in its colour. Carries ``data-mnb-node``/``data-mnb-state``."""
    colour = STATE_COLOURS.get(node.state, ("inherit",))[0]
    mark = STATE_MARKS.get(node.state, "")
    head = f"{mark} {html.escape(node.title)}" if mark else f"<b>{html.escape(node.title)}</b>"
    text = html.escape(node.text)
    if node.cause:
        text = text.replace(html.escape(node.cause), f"<b>{html.escape(node.cause)}</b>", 1)
    return (f'<span class="mnb-node" data-mnb-node="{html.escape(node.key)}" data-mnb-state="{node.state}" '
            f'style="font-family:var(--jp-code-font-family,monospace);white-space:nowrap">'
            f'<span style="color:{colour}">{head}</span>'
            f'<span style="color:{colour if node.state in DOWN else "inherit"}">'
            f"{'&nbsp;&nbsp;' + text if text else ''}</span></span>")


def to_html(tree: dict, previous: dict | None = None, note: str | None = None) -> str:
    """The tree as static HTML (``<details>`` levels a reader can open and close), for
    places where widgets don't render: nbconvert, GitHub, a saved notebook. ``note``:
    see ``summary_html``."""
    out = [f'<div class="mnb-health" data-mnb-cluster="{html.escape(tree["cluster"])}">',
           f"<div>{summary_html(tree, note)}</div>"]

    def walk(node: Node) -> None:
        if not node.children:
            out.append(f"<li>{label_html(node)}</li>")
            return
        out.append(f"<li><details{' open' if node.open else ''}><summary>{label_html(node)}</summary>"
                   '<ul style="list-style:none;margin:0;padding-left:1.4em">')
        for child in node.children:
            walk(child)
        out.append("</ul></details></li>")

    out.append('<ul style="list-style:none;margin:0;padding-left:0">')
    for top in nodes(tree, previous):
        walk(top)
    out.append("</ul></div>")
    return "".join(out)


# rich -------------------------------------------------------------------------------------
def to_rich(tree: dict, previous: dict | None = None):
    """The tree as a ``rich.tree.Tree`` for terminals (``monarch-nb cluster status``);
    healthy actors of actor meshes are left out (the hosts part lists them)."""
    from rich.markup import escape
    from rich.tree import Tree

    def label(node: Node) -> str:
        style = STATE_COLOURS.get(node.state, (None, None))[1]
        mark = STATE_MARKS.get(node.state, "")
        head = f"{mark} {escape(node.title)}" if mark else f"[bold]{escape(node.title)}[/]"
        text = escape(node.text)
        if style and node.state in DOWN:
            text = f"[{style}]{text}[/]"
        return (f"[{style}]{head}[/]" if style else head) + (f"  {text}" if text else "")

    summary = " · ".join(f"[{STATE_COLOURS[s][1]}]{escape(t)}[/]" if s else escape(t)
                         for t, s in summary_parts(tree))
    root = Tree(f"cluster [bold]{escape(tree['cluster'])}[/] · {summary}")

    def walk(node: Node, parent) -> None:
        branch = parent.add(label(node))
        for child in node.children:
            if not (node.key.startswith("mesh:") and child.state == HealthState.HEALTHY):
                walk(child, branch)

    for top in nodes(tree, previous):
        walk(top, root)
    return root
