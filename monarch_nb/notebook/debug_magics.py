"""``%monarch break ...`` and ``%monarch debug ...``: distributed breakpoints from the
notebook (see ``monarch_nb.client.debugger`` for what they do).

The line after ``break``/``debug`` is taken raw (not through the other subcommands'
parser), so that ``debug eval`` gets its Python expression exactly as typed.
"""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import threading
import time
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicArgumentParser
from IPython.display import display

from ..client.actor_mesh import ActorMesh
from ..client.debugger import Stop
from ..mesh.ranks import format_ranks
from .cell_names import CellNames
from .display import widgets_render

HELP = """\
  %monarch break FILE:LINE [MESH] [--ranks 0-3] [--condition EXPR]
                                                          pause there (FILE:LINE, or NAME[:LINE] of a
                                                          function/class of this notebook)
  %monarch break --list | --clear [ID ...]                the cluster's breakpoints
  %monarch debug                                          paused ranks (live)
  %monarch debug where|locals MESH RANK                   stack with source / local variables
  %monarch debug eval MESH[RANKS] EXPR                    evaluate in every selected paused rank
  %monarch debug step|next|out|continue MESH[RANKS]       run the paused ranks on; continue --all
  %monarch debug attach MESH RANK [--jupyterlab]          relay for VS Code (prints launch.json), or
                                                          the JupyterLab debugger panel on that rank
  %monarch debug --post-mortem on|off                     pause ranks at unhandled endpoint errors"""

_TARGET = re.compile(r"^(?P<mesh>[^\[\]\s]+)(?:\[(?P<ranks>[0-9,\- ]*)\])?$")
# `debug eval`'s target and expression: ranks may be written with spaces ("t[0, 2] x").
_EVAL = re.compile(r"^\s*(?P<target>[^\[\]\s]+(?:\[[^\]]*\])?)\s+(?P<expression>.*\S.*)$", re.S)
_relays: list = []  # relays opened by `%monarch debug attach` (live until the kernel exits)


def run(magics, verb: str, rest: str):
    """Entry from ``%monarch``: ``verb`` is ``break`` or ``debug``."""
    if verb == "break":
        return _break(magics, rest)
    return _debug(magics, rest)


def _debugger(magics):
    return magics._cluster().debugger


def _mesh_name(magics, name: str) -> str:
    value = magics.shell.user_ns.get(name)
    return value.name if isinstance(value, ActorMesh) else name


def split_eval(tail: str) -> tuple[str, str]:
    """``MESH[RANKS] EXPR`` -> (target, expression), ``("", "")`` when either is missing."""
    match = _EVAL.match(tail)
    return (match["target"], match["expression"].strip()) if match else ("", "")


def _target(magics, text: str) -> tuple[str, list[int] | None]:
    """``MESH`` or ``MESH[0-3,5]`` -> (mesh name, ranks or None)."""
    match = _TARGET.match(text.strip())
    if not match:
        raise UsageError(f"{text!r}: write MESH or MESH[RANKS], e.g. trainers[0-3]")
    ranks = match["ranks"]
    from ..mesh.ranks import parse_ranks

    try:
        parsed = parse_ranks(ranks) if ranks else None
    except ValueError as e:
        raise UsageError(str(e)) from None
    return _mesh_name(magics, match["mesh"]), parsed


# break -------------------------------------------------------------------------------
def _break_parser() -> MagicArgumentParser:
    parser = MagicArgumentParser(prog="%monarch break", add_help=False)
    parser.add_argument("location", nargs="?")
    parser.add_argument("mesh", nargs="?")
    parser.add_argument("--ranks", default=None)
    parser.add_argument("--condition", default=None)
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--clear", nargs="*", type=int, default=None)
    return parser


def _resolve(magics, location: str):
    """(what, line) for ``Debugger.set_breakpoint``: a notebook object ``NAME[:LINE]``
    or a ``FILE:LINE`` path."""
    name, sep, number = location.rpartition(":")
    if not sep or not number.isdigit():
        name, number = location, ""
    if re.fullmatch(r"[A-Za-z_][\w.]*", name):
        try:
            obj = eval(name, magics.shell.user_ns)
        except Exception:
            obj = None
        if callable(obj):
            return obj, int(number) if number else None
        first = name.split(".")[0]
        if first not in magics.shell.user_ns and not name.endswith(".py"):
            # A name of notebook code this kernel has not defined (yet): e.g. after a restart.
            raise UsageError(f"%monarch break {location}: {first} is not defined in this kernel (restarted?): "
                             f"re-run the cell that defines {first}, then set the breakpoint again")
    if not number:
        raise UsageError(f"%monarch break {location}: write FILE:LINE, or NAME[:LINE] of a function or class "
                         "defined here")
    return f"{name}:{number}", None


def _break(magics, rest: str) -> None:
    try:
        args = _break_parser().parse_args(shlex.split(rest))
    except ValueError as e:
        raise UsageError(f"%monarch break: {e}") from None
    dbg = _debugger(magics)
    if args.clear is not None:
        n = dbg.clear_breakpoints(args.clear or None)
        print(f"monarch: cleared {n} breakpoint(s)")
        return
    if args.list or args.location is None:
        bps = dbg.breakpoints()
        if not bps:
            print("monarch: no breakpoints")
        for bp in bps:
            print(_describe_breakpoint(bp))
        return
    where, line = _resolve(magics, args.location)
    mesh = _mesh_name(magics, args.mesh) if args.mesh else None
    bp = dbg.set_breakpoint(where, line, mesh=mesh, ranks=args.ranks, condition=args.condition)
    print(f"monarch: {_describe_breakpoint(bp)}{_describe_binding(bp)}")


def _describe_binding(bp: dict) -> str:
    """Where the breakpoint bound: in how many procs, and in which file when the actors
    run the code from elsewhere (an earlier kernel's cell); or that it bound nowhere."""
    files = sorted({b["file"] for b in bp["bound"]})
    if not files:
        whose = f"no actor of {bp['mesh']}" if bp["mesh"] else "no actor"
        return (f"\nmonarch: it binds nowhere yet: {whose} runs this code as far as their classes show "
                "(code they are handed later, e.g. as an argument, and actors spawned later stop there when "
                "they run it; if the class changed since they were spawned, spawn them again with replace=True)")
    elsewhere = [f for f in files if f != bp["file"]]
    where = f" at {', '.join(elsewhere)}, the code the actors run" if elsewhere else ""
    return f", bound in {len(bp['bound'])} proc(s){where}"


def _describe_breakpoint(bp: dict) -> str:
    scope = "any proc" if bp["mesh"] is None else bp["mesh"] + (
        f" ranks {format_ranks(bp['ranks'])}" if bp["ranks"] is not None else "")
    cond = f" if {bp['condition']}" if bp["condition"] else ""
    return f"breakpoint {bp['id']} at {bp['file']}:{bp['line']} ({scope}){cond}"


# debug -------------------------------------------------------------------------------
def _debug(magics, rest: str):
    words = rest.split(None, 1)
    action = words[0] if words else "list"
    tail = words[1] if len(words) > 1 else ""
    dbg = _debugger(magics)
    if action == "--post-mortem":
        if tail.strip() not in ("on", "off"):
            raise UsageError("%monarch debug --post-mortem on|off")
        on = dbg.post_mortem(tail.strip() == "on")
        print(f"monarch: post-mortem {'on: ranks pause at unhandled endpoint errors' if on else 'off'}")
        return None
    names = CellNames(magics.shell)
    if action == "list":
        display(PausedView(dbg, names))
        return None
    if action in ("where", "locals", "attach"):
        parts = tail.split()
        lab = action == "attach" and "--jupyterlab" in parts
        parts = [p for p in parts if p != "--jupyterlab"]
        if len(parts) != 2 or not parts[1].isdigit():
            raise UsageError(f"%monarch debug {action} MESH RANK")
        mesh, rank = _mesh_name(magics, parts[0]), int(parts[1])
        if action == "where":
            for i, frame in enumerate(dbg.where(mesh, rank)):
                label = names.label(frame.file)
                print(f"#{i} {frame.function} at " + (f"{label}, line {frame.line}" if label is not None
                                                       else f"{frame.file}:{frame.line}"))
                if frame.source:
                    print(f"      {frame.source.strip()}")
        elif action == "locals":
            for name, value in dbg.locals(mesh, rank).items():
                print(f"{name} = {value}")
        elif lab:
            from . import lab_debugger

            kernel = getattr(magics.shell, "kernel", None)
            if kernel is None:
                raise UsageError("%monarch debug attach --jupyterlab needs a Jupyter kernel")
            try:
                lab_debugger.attach(kernel, dbg, mesh, rank)
            except RuntimeError as e:
                raise UsageError(f"%monarch debug attach: {e}") from None
            print(f"monarch: this kernel's debugger now drives {mesh} rank {rank}: open the JupyterLab debugger "
                  "panel (the bug icon) to see its stack and variables and to step it; turning the panel's "
                  "debugger off gives the kernel its own back")
        else:
            relay = dbg.attach(mesh, rank)
            _relays.append(relay)
            config = relay.launch_config(getattr(relay, "remote_cwd", None))
            print(f"monarch: {mesh} rank {rank} is on 127.0.0.1:{relay.port} for an IDE (DAP, relayed over the "
                  "cluster's signed channel). VS Code launch.json entry:")
            print(json.dumps(config, indent=2))
        return None
    if action == "eval":
        target, expression = split_eval(tail)
        if not target or not expression:
            raise UsageError("%monarch debug eval MESH[RANKS] EXPR, e.g. %monarch debug eval trainers[0-3] loss")
        mesh, ranks = _target(magics, target)
        results = dbg.eval(expression.strip(), mesh, ranks)
        print(repr(results))
        return None
    if action in ("step", "next", "out", "continue"):
        if action == "continue" and tail.strip() == "--all":
            print(f"monarch: continued {dbg.continue_all()} paused thread(s)")
            return None
        if not tail.strip():
            raise UsageError(f"%monarch debug {action} MESH[RANKS] (or continue --all)")
        mesh, ranks = _target(magics, tail)
        if action == "continue":
            done = dbg.continue_(mesh, ranks)
            print(f"monarch: continued {mesh} rank(s) {format_ranks(done) or 'none (already running)'}")
            return None
        moved = {"step": dbg.step, "next": dbg.next, "out": dbg.step_out}[action](mesh, ranks)
        for rank, stop in sorted(moved.items()):
            print(f"[{mesh} {rank}] " + (f"at {names.where(stop.file, stop.line)} in {stop.function}"
                                         if stop is not None else
                                         f"running: the {action} is still pending and pauses this rank at the "
                                         "next line of user code it runs (a later call's, if this one ended)"))
        return None
    raise UsageError(f"%monarch debug: unknown action {action!r}\n{HELP}")


# the paused list ----------------------------------------------------------------------
COLUMNS = ("mesh", "rank", "host", "pid", "thread", "where", "function", "call", "reason", "paused since")


def _rows(stops: list[Stop], names: CellNames | None) -> list[tuple]:
    """One row per stop; ``names``: the kernel's cells by name (``Cell In[12], line 5``)."""
    def where(s: Stop) -> str:
        return names.where(s.file, s.line) if names is not None else f"{os.path.basename(s.file or '?')}:{s.line}"

    return [(s.mesh or "-", "-" if s.rank is None else str(s.rank), s.host, str(s.pid), s.thread,
             where(s), s.function or "", s.endpoint or "",
             (s.reason or "") + (f" ({s.text})" if s.text else ""),
             time.strftime("%H:%M:%S", time.localtime(s.since))) for s in stops]


def to_plain(stops: list[Stop], names: CellNames | None = None) -> str:
    if not stops:
        return "no paused ranks"
    rows = [COLUMNS] + _rows(stops, names)
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return f"{len(stops)} paused\n" + "\n".join(lines)


def to_html(stops: list[Stop], names: CellNames | None = None) -> str:
    if not stops:
        return "<div class='mnb-paused'>no paused ranks</div>"
    head = "".join(f"<th style='text-align:left'>{c}</th>" for c in COLUMNS)
    body = "".join("<tr data-mnb-stop='{}'>{}</tr>".format(
        html.escape(s.key), "".join(f"<td style='text-align:left'>{html.escape(v)}</td>" for v in row))
        for s, row in zip(stops, _rows(stops, names)))
    return (f"<div class='mnb-paused'><b>{len(stops)} paused</b><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></div>")


class PausedView:
    """What ``%monarch debug`` shows: the paused ranks as an ipywidgets table that
    follows the hub's ``debug_changed`` events (in a kernel), with ``text/html`` and
    ``text/plain`` fallbacks of the list at display time."""

    _live: "PausedView | None" = None  # the newest live view (older ones stop following)
    _lock = threading.Lock()

    def __init__(self, debugger, names: CellNames | None = None):
        self.debugger = debugger
        self.names = names
        self.stops = debugger.paused()
        self.widget: Any = None  # an ipywidgets.HTML once shown in a kernel
        self._unwatch: Any = None

    def _on_change(self, stops: list[Stop]) -> None:
        self.stops = stops
        if self.widget is not None:
            self.widget.value = to_html(stops, self.names)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        bundle = {"text/plain": to_plain(self.stops, self.names), "text/html": to_html(self.stops, self.names)}
        if widgets_render():
            import ipywidgets

            self.widget = ipywidgets.HTML(value=to_html(self.stops, self.names))
            with PausedView._lock:
                old, PausedView._live = PausedView._live, self
            if old is not None and old._unwatch is not None:
                old._unwatch()
            self._unwatch = self.debugger.watch(self._on_change)
            view = self.widget._repr_mimebundle_()
            bundle["application/vnd.jupyter.widget-view+json"] = view["application/vnd.jupyter.widget-view+json"]
        return bundle

    def __repr__(self) -> str:
        return to_plain(self.stops, self.names)
