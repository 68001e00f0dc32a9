"""``%monarch SUBCOMMAND`` and ``%%monarch exec MESH``: common cluster work in one line.

Mistakes (unknown mesh, bad rank spec, not connected) raise IPython's ``UsageError``:
one line with a hint, no traceback.
"""

from __future__ import annotations

import argparse
import ast
import io
import shlex
import sys
import time
from typing import Callable

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser
from rich.console import Console

from .. import health_view, render
from .. import service as service_api  # noqa: F401 - installs Cluster.services (a kernel restarted on a cluster finds its services)
from ..allocators import slurm_options
from ..client import cluster as cluster_mod
from ..client import logs
from ..client.actor_mesh import ActorMesh
from ..client.actor_meshes import resolve
from ..client.future import Future
from ..client.proc_mesh import ProcMesh
from ..client.runtime import runtime
from ..client.value_mesh import ValueMesh
from ..errors import ActorError, MonarchNbError, RemoteFailure, SupervisionError
from ..protocol import hub_ops
from ..protocol.records import LOG_FIELDS
from ..mesh import Extent
from ..mesh.ranks import format_ranks, parse_ranks, parse_ranks_of
from ..proc import exec_actor
from ..proc.exec_actor import Exec
from . import debug_magics
from .interrupts import CellInterrupts


class ExecFailed(MonarchNbError):
    """``%%monarch exec`` raised on some ranks (their tracebacks are shown above)."""


class _Parser(MagicArgumentParser):
    """Usage errors are one line naming the subcommand, with its usage (argparse's alone
    read "the following arguments are required: var")."""

    def error(self, message):
        usage = argparse.HelpFormatter(self.prog)  # IPython's formatter writes reST, for docstrings
        usage.add_usage(self.usage, self._actions, self._mutually_exclusive_groups)
        raise UsageError(f"{self.prog}: {message}; {' '.join(usage.format_help().split())}")


LOGS_TAIL = 50  # lines %monarch logs shows, unless told (--tail)


def _parser() -> MagicArgumentParser:
    parser = _Parser(prog="%monarch", add_help=False,
                                 description="Drive a monarch_nb cluster from the notebook.")
    verbs = parser.add_subparsers(dest="verb", metavar="SUBCOMMAND")
    start = verbs.add_parser("start", help="start (or reconnect to) a retained cluster")
    start.add_argument("name", nargs="?", default=cluster_mod.DEFAULT_NAME)
    start.add_argument("--hosts", type=int, default=None)
    start.add_argument("--idle-timeout", type=float, default=None)
    slurm_options.add_arguments(start)
    verbs.add_parser("connect", help="connect to a running cluster").add_argument("name", nargs="?")
    verbs.add_parser("list", help="list clusters")
    verbs.add_parser("stop", help="stop a cluster (default: the connected one)").add_argument("name", nargs="?")
    procs = verbs.add_parser("procs", help="spawn a proc mesh and bind it to VAR")
    procs.add_argument("var")
    procs.add_argument("--per-host", default="gpus=1", help="e.g. gpus=8 or gpus=4,cpus=2")
    procs.add_argument("--name", default=None, help="mesh name (default: VAR)")
    spawn = verbs.add_parser("spawn", help="spawn an actor mesh and bind it to VAR")
    spawn.add_argument("var")
    spawn.add_argument("cls", metavar="CLASS")
    spawn.add_argument("--procs", default=None, help="proc mesh variable (default: the last %%monarch procs)")
    spawn.add_argument("--name", default=None, help="mesh name (default: VAR)")
    spawn.epilog = "constructor arguments follow --, as in a Python call: -- 0.1, name='a b', lr=0.5"
    verbs.add_parser("status", help="the live health tree (hosts, procs, actors, services) and clients of the cluster")
    verbs.add_parser("service", help="a service's replicas: state, requests, in flight, p50/p99, restarts"
                     ).add_argument("name", nargs="?")
    log = verbs.add_parser("logs", help="lines from the cluster's log store")
    log.add_argument("mesh", nargs="?")
    log.add_argument("--ranks", default=None)
    log.add_argument("--tail", type=int, default=None, help=f"lines shown (default {LOGS_TAIL})")
    log.add_argument("--since", type=float, default=None, help="seconds ago")
    log.add_argument("--grep", default=None)
    log.add_argument("--stream", choices=("stdout", "stderr"), default=None)
    log.add_argument("--follow", action="store_true", help="keep showing new lines until interrupted")
    log.add_argument("--fold", choices=("on", "off"), default=None, help="fold identical lines across ranks")
    verbs.add_parser("interrupt", help="KeyboardInterrupt into the endpoints running on a mesh").add_argument("mesh")
    verbs.add_parser("sync", help="send changed .py files of this folder to the procs and reload them there"
                     ).add_argument("mesh", nargs="?")
    config = verbs.add_parser("config", help="notebook settings (no value: show them)")
    config.add_argument("setting", nargs="?", choices=("interrupt_remote",))
    config.add_argument("value", nargs="?", choices=("on", "off"))
    # Parsed by debug_magics on the raw line; listed here so that mistakes name them.
    verbs.add_parser("break", help="breakpoints in actor code (see %monarch help)", add_help=False)
    verbs.add_parser("debug", help="paused ranks: list, where, locals, eval, step, continue, attach", add_help=False)
    verbs.add_parser("help", help="this help")
    execute = verbs.add_parser("exec", help="(cell magic) run the cell in every proc of MESH")
    execute.add_argument("mesh")
    execute.add_argument("--ranks", default=None)
    execute.add_argument("--block", dest="block", action="store_true", default=True)
    execute.add_argument("--no-block", dest="block", action="store_false")
    return parser


PARSER = _parser()
HELP = """%monarch: drive a monarch_nb cluster from the notebook.

  %monarch start [NAME] [--hosts N] [--idle-timeout S]   start a retained cluster (or connect if it runs)
  %monarch start NAME --slurm --nodes 2 [--partition P] [--time T] [--mem M] [--gpus-per-node G] [--account A]
                [--qos Q] [--cpus-per-task C] [--setup LINE] [--sbatch-arg=OPT] [--dry-run]
                                                          hosts from a Slurm job, one per node (--dry-run:
                                                          print its batch script); defaults: config.toml
  %monarch connect [NAME]                                 connect to a running cluster
  %monarch list                                           clusters on this machine
  %monarch status                                         live health tree (hosts, procs, actors, services), clients
  %monarch service [NAME]                                 a service's replicas: state, requests, in flight,
                                                          p50/p99 latency, restarts (no NAME: every service)
  %monarch stop [NAME]                                    stop a cluster (default: the connected one)
  %monarch procs VAR --per-host gpus=8 [--name N]         spawn procs, bind them to VAR
  %monarch spawn VAR CLASS [--procs P] [--name N] [-- ARGS]
                                                          spawn CLASS(ARGS) on procs P, bind it to VAR;
                                                          ARGS as in a Python call: -- 0.1, name='a', lr=0.5
  %monarch logs [MESH] [--ranks 0-3,5] [--tail N] [--since S] [--grep RE]
                [--stream stdout|stderr] [--follow] [--fold on|off]
                                                          lines from the cluster's log store
  %monarch interrupt MESH                                 KeyboardInterrupt into endpoints running there
  %monarch sync [MESH]                                    this folder's changed .py files to the procs of MESH
                                                          (default: every proc mesh), reloaded there; live
                                                          actors go on with the new code (sync_workspace)
  %monarch config [interrupt_remote on|off]               Ctrl-C in a cell also interrupts its calls on the
                                                          cluster (on, the default) or leaves them running
  %%monarch exec MESH [--ranks 0-3] [--no-block]          run the cell in every proc of MESH
__DEBUG_HELP__
  %monarch help                                           this help

MESH and P are variables of this notebook or names of meshes in the cluster."""
HELP = HELP.replace("__DEBUG_HELP__", debug_magics.HELP)
FOLLOW_POLL_S = 0.5
NOTEBOOK_WIDTH = 160  # columns of rich output in a kernel (tables shrink to their content)
# What an exec cell printed is what its user asked for: wait longer for it on a loaded machine
# than a plain cell end does (only as long as the lines take to come).
EXEC_FLUSH_S = 20.0
_HTML_FORMAT = '<pre style="font-family:var(--jp-code-font-family,monospace);line-height:1.3">{code}</pre>'


@magics_class
class MonarchMagics(Magics):
    """The ``%monarch`` line magic and ``%%monarch exec`` cell magic."""

    def __init__(self, shell, interrupts: CellInterrupts):
        super().__init__(shell)
        self.last_procs: str | None = None  # the variable of the last `%monarch procs`
        self.interrupts = interrupts  # what Ctrl-C does to the cell's calls (`%monarch config`)

    @line_cell_magic
    def monarch(self, line: str, cell: str | None = None):
        """%monarch start|connect|list|stop|procs|spawn|status|logs|interrupt|config|break|debug|help ...
        %%monarch exec MESH [--ranks SPEC] [--no-block]"""
        verb, _, raw = line.strip().partition(" ")
        if verb in ("break", "debug") and cell is None:  # raw: `debug eval` takes Python as typed
            try:
                return debug_magics.run(self, verb, raw)
            except (MonarchNbError, ValueError, TimeoutError) as e:
                raise UsageError(f"%monarch {verb}: {e}") from None
        # What follows " -- " is Python call arguments (spawn's constructor arguments).
        line, _, rest = f" {line} ".partition(" -- ")
        try:
            argv = shlex.split(line)
        except ValueError as e:
            raise UsageError(f"%monarch: {e}") from None
        args = PARSER.parse_args(argv or ["help"])
        args.args = rest.strip()
        if (cell is None) == (args.verb == "exec"):
            raise UsageError("exec is a cell magic: put `%%monarch exec MESH` on the cell's first line"
                             if cell is None else f"%%monarch takes only `exec`, not {args.verb!r}")
        try:
            return getattr(self, f"_{args.verb}")(args, cell)
        except MonarchNbError as e:
            if isinstance(e, (ActorError, ExecFailed, SupervisionError)):  # not usage mistakes
                raise
            raise UsageError(f"%monarch {args.verb}: {e}") from None
        except ValueError as e:
            raise UsageError(f"%monarch {args.verb}: {e}") from None

    # helpers -----------------------------------------------------------------------
    def _cluster(self) -> cluster_mod.Cluster:
        cluster = runtime().cluster
        if cluster is None or cluster._stopped:
            raise UsageError("not connected to a cluster: run %monarch start [NAME] or %monarch connect [NAME]")
        return cluster

    def _lookup(self, name: str):
        """A variable of the notebook, else a mesh of that name in the cluster."""
        ns = self.shell.user_ns
        if name in ns and isinstance(ns[name], (ProcMesh, ActorMesh)):
            return ns[name]
        cluster = self._cluster()
        info = cluster.info()
        if name in info["proc_meshes"]:
            return cluster._proc_mesh(info["proc_meshes"][name])
        try:
            key = resolve(info["actor_meshes"], name)
        except KeyError as e:
            raise UsageError(e.args[0]) from None
        if key is not None:
            return cluster._actor_mesh(info["actor_meshes"][key])
        known = sorted(info["proc_meshes"]) + sorted(info["actor_meshes"])
        raise UsageError(f"no mesh {name!r}: not a mesh variable nor a mesh of the cluster "
                         f"(meshes: {', '.join(known) or 'none'})")

    def _procs_of(self, name: str) -> ProcMesh:
        """The proc mesh behind ``name`` (a proc mesh, or the procs of an actor mesh)."""
        mesh = self._lookup(name)
        if isinstance(mesh, ProcMesh):
            return mesh
        cluster = self._cluster()
        info = cluster.info()
        return cluster._proc_mesh(info["proc_meshes"][mesh._proc_mesh_name])

    def _print(self, *renderables) -> None:
        """Show rich renderables: in a terminal, printed; in a kernel, one display whose
        ``text/html`` has the colours and whose ``text/plain`` has none (no ANSI codes)
        and is not cut at rich's 80 columns (kernels have no TTY to measure)."""
        if getattr(self.shell, "kernel", None) is None:
            console = Console(highlight=False)  # no guessing: "host(s)" is not a call
            for r in renderables:
                console.print(r)
            return
        from IPython.display import display

        console = Console(highlight=False, record=True, file=io.StringIO(), width=NOTEBOOK_WIDTH,
                          force_jupyter=False, force_terminal=True, color_system="truecolor")
        for r in renderables:
            console.print(r)
        text = "\n".join(line.rstrip() for line in console.export_text(clear=False).splitlines())
        display({"text/plain": text, "text/html": console.export_html(inline_styles=True, code_format=_HTML_FORMAT)},
                raw=True)

    # subcommands ---------------------------------------------------------------------
    def _help(self, args, cell=None) -> None:
        print(HELP)

    def _start(self, args, cell=None) -> None:
        t0 = time.monotonic()
        allocator = slurm_options.allocator_from(args)
        if args.dry_run:
            print(f"monarch: --dry-run: the batch script of cluster {args.name!r}; nothing submitted\n")
            print(allocator.job_script(args.name), end="")
            return
        cluster = cluster_mod.Cluster.start(args.name, hosts=args.hosts, idle_timeout=args.idle_timeout,
                                            allocator=allocator)
        info = cluster.info()
        where = slurm_options.describe(cluster._info)
        print(f"monarch: cluster {args.name!r} is up ({len(info['hosts'])} host(s){', ' + where if where else ''}, "
              f"{len(info['actor_meshes'])} actor mesh(es); {time.monotonic() - t0:.2f} s){self._bind(cluster)}")

    def _connect(self, args, cell=None) -> None:
        cluster = cluster_mod.connect(args.name)
        info = cluster.info()
        print(f"monarch: connected to cluster {cluster.name!r} ({len(info['hosts'])} host(s), "
              f"proc meshes: {', '.join(info['proc_meshes']) or 'none'}, "
              f"actor meshes: {', '.join(info['actor_meshes']) or 'none'}){self._bind(cluster)}")

    def _bind(self, cluster) -> str:
        """Bind ``cluster`` to the name ``cluster`` (as the kernel's auto-connect does)
        unless the user keeps something else there; returns what to add to the message."""
        if not isinstance(self.shell.user_ns.get("cluster", cluster), cluster_mod.Cluster):
            return "; `cluster` is yours, so it was left alone"
        self.shell.user_ns["cluster"] = cluster
        return "; it is `cluster`"

    def _list(self, args, cell=None) -> None:
        self._print(render.clusters_table(cluster_mod.list_clusters()))

    def _stop(self, args, cell=None) -> None:
        cluster = cluster_mod.connect(args.name) if args.name else self._cluster()
        cluster.stop()
        print(f"monarch: cluster {cluster.name!r} stopped")

    def _status(self, args, cell=None) -> None:
        cluster = self._cluster()
        info = cluster.info()
        if getattr(self.shell, "kernel", None) is None:  # a terminal: the rich tree
            self._print(*render.status(info, cluster.health()))
            return
        from IPython.display import display

        # No header line: the widget's own summary line stays true (a static "running ·
        # 4/4 procs alive" would not, once the cluster stops).
        display(cluster)  # the live health tree widget (html/plain where widgets don't render)
        self._print(render.clients_table(info))

    def _service(self, args, cell=None) -> None:
        cluster = self._cluster()
        found = {s["name"]: s for s in cluster.health().get("services", ())}
        if args.name is None:
            print("\n".join(health_view.service_text(s).partition("\n")[0] for s in found.values())
                  or f"monarch: cluster {cluster.name!r} has no services; make one with "
                  "Cls.options(num_replicas=N).as_service()")
            return
        if args.name not in found:
            raise UsageError(f"no service {args.name!r} in cluster {cluster.name!r} (services: "
                             f"{', '.join(sorted(found)) or 'none'}); make one with "
                             "Cls.options(name=..., num_replicas=N).as_service()")
        print(health_view.service_text(found[args.name]))

    def _procs(self, args, cell=None) -> None:
        per_host = {}
        for part in args.per_host.split(","):
            label, eq, size = part.partition("=")
            if not eq or not size.strip().isdigit():
                raise UsageError(f"--per-host {args.per_host!r}: write LABEL=SIZE[,LABEL=SIZE], e.g. gpus=8")
            per_host[label.strip()] = int(size)
        Extent(per_host)
        procs = self._cluster().this_host().spawn_procs(per_host=per_host, name=args.name or args.var)
        self.shell.user_ns[args.var] = procs
        self.last_procs = args.var
        print(f"monarch: {args.var} = {procs!r}")

    def _spawn(self, args, cell=None) -> None:
        ns = self.shell.user_ns
        try:
            cls = eval(args.cls, ns)
        except Exception as e:
            raise UsageError(f"%monarch spawn: class {args.cls!r} is not defined here ({e})") from None
        procs_var = args.procs or self.last_procs
        if procs_var is None:
            raise UsageError("%monarch spawn: which procs? pass --procs VAR, or make some with %monarch procs VAR")
        procs = self._lookup(procs_var)
        if not isinstance(procs, ProcMesh):
            raise UsageError(f"%monarch spawn: {procs_var!r} is an actor mesh; --procs wants a proc mesh")
        positional, keywords = _call_arguments(args.args, ns)
        mesh = procs.spawn(args.name or args.var, cls, *positional, **keywords)
        ns[args.var] = mesh
        print(f"monarch: {args.var} = {mesh!r}")

    def _logs(self, args, cell=None) -> None:
        stopped = runtime().cluster
        if args.tail is not None and args.tail < 1:
            raise UsageError(f"%monarch logs: --tail {args.tail}: give a number of lines >= 1")
        if args.since is not None and not args.since > 0:
            raise UsageError(f"%monarch logs: --since {args.since:g}: give how many seconds ago, a number > 0")
        tail = LOGS_TAIL if args.tail is None else args.tail
        live = runtime().lines.folder
        if args.fold is not None and not any((args.mesh, args.ranks, args.tail, args.since, args.grep, args.stream,
                                              args.follow)):
            # Alone, the switch of the output under cells from now on; with a query, that
            # query's (it used to switch both, and drop the query).
            live.enabled = args.fold == "on"
            print(f"monarch: folding of the output under cells {args.fold}")
            return
        fold = live.enabled if args.fold is None else args.fold == "on"
        if stopped is not None and stopped._stopped:  # the lines kept of the cluster this kernel stopped
            since = -args.since if args.since is not None else None
            ranks = parse_ranks(args.ranks) if args.ranks else None
            self._show_last(lambda tail: stopped.logs(mesh=args.mesh, ranks=ranks, stream=args.stream, since=since,
                                                      grep=args.grep, tail=tail), tail, fold)
            return
        cluster = self._cluster()
        mesh_name = None
        if args.mesh is not None:
            mesh = self.shell.user_ns.get(args.mesh)
            mesh_name = mesh._name if isinstance(mesh, (ProcMesh, ActorMesh)) else args.mesh
        ranks = parse_ranks(args.ranks) if args.ranks else None
        since = -args.since if args.since is not None else None
        found = self._show_last(lambda tail: cluster.logs(mesh=mesh_name, ranks=ranks, stream=args.stream,
                                                          since=since, grep=args.grep, tail=tail), tail, fold)
        if not found and not args.follow:
            missing = logs.no_such_mesh(cluster.info(), mesh_name) if mesh_name is not None else None
            if missing is not None:
                raise UsageError(f"%monarch logs: {missing}")
            print(f"monarch: no lines{' for ' + mesh_name if mesh_name else ''} match")
        last = found[-1]["seq"] if found else 0
        try:  # Ctrl-C (a kernel interrupt) ends the follow, wherever in the loop it lands
            while args.follow:
                time.sleep(FOLLOW_POLL_S)  # polling the store
                reply = cluster.hub.request(hub_ops.LOGS_QUERY, timeout=30.0, mesh=mesh_name, ranks=ranks,
                                            stream=args.stream, grep=args.grep, after_seq=last)
                if reply["records"]:
                    last = reply["records"][-1][logs.SEQ]
                    logs.print_sink(logs.fold_records(reply["records"], fold))
        except KeyboardInterrupt:
            return

    @staticmethod
    def _show_last(query: Callable[[int | None], list[dict]], tail: int | None, fold: bool) -> list[dict]:
        """Show the last ``tail`` lines (as shown: folded lines count once, with ``fold``)
        of what ``query(n)`` (``Cluster.logs`` with its filters, the last ``n`` records)
        finds; returns the records it read last."""
        found: list[dict] = []

        def fetch(n: int | None) -> list[list]:
            found[:] = query(n)
            return [[r[f] for f in LOG_FIELDS] for r in found]

        if tail is None:
            logs.print_sink(logs.fold_records(fetch(None), fold))
        else:
            logs.print_sink(logs.tail_shown(fetch, tail, fold))
        return found

    def _interrupt(self, args, cell=None) -> None:
        procs = self._procs_of(args.mesh)
        procs.interrupt()
        print(f"monarch: interrupted the endpoints running on {procs.name} ({len(procs)} procs)")

    def _sync(self, args, cell=None) -> None:
        if args.mesh is not None:
            meshes = [self._procs_of(args.mesh)]
        else:
            cluster = self._cluster()
            meshes = [cluster._proc_mesh(record) for record in cluster.info()["proc_meshes"].values()]
        for procs in meshes:
            result = procs.sync_workspace()
            sent = sum(len(files) for files in result["sent"].values())
            print(f"monarch: {procs.name}: {result['files']} .py file(s) checked, {sent} sent; reloaded: "
                  f"{', '.join(result['reloaded']) or 'nothing changed'}"
                  + (f"; actors on the new code: {', '.join(result['swapped'])}" if result["swapped"] else ""))
            for problem in result["problems"]:
                print(f"monarch: {procs.name}: {problem}")

    def _config(self, args, cell=None) -> None:
        if args.value is not None:
            self.interrupts.remote = args.value == "on"
        print(f"interrupt_remote {'on' if self.interrupts.remote else 'off'}")

    def _exec(self, args, cell: str):
        procs = self._procs_of(args.mesh)
        ranks = parse_ranks_of(args.ranks, procs.name, procs.extent) if args.ranks else list(range(len(procs)))
        # The handle itself, not the actor class a type checker is told spawn returns.
        runner: ActorMesh = procs.spawn(exec_actor.mesh_name(procs.name), Exec)  # type: ignore[assignment]
        name = f"<%%monarch exec {procs.name}>"
        if ranks == list(range(len(procs))):
            future: Future[ValueMesh] | _Gathered = runner.run.call(cell, name)
            extent = procs.extent
        else:
            futures = [runner.slice(**dict(procs.extent.point(r))).run.call_one(cell, name) for r in ranks]
            future = _Gathered(procs.name, futures)
            extent = Extent({"ranks": len(ranks)})
        if not args.block:
            self.shell.user_ns["_"] = future
            return None
        try:
            values = future.get()
        except ActorError as e:
            self._cluster().flush_logs(timeout=EXEC_FLUSH_S)
            self._show_failures(runner.name, ranks, e, name)
            raise ExecFailed(f"exec failed on rank(s) {format_ranks(_failed_ranks(ranks, e))} of "
                             f"{procs.name}; tracebacks above") from None
        result = values if isinstance(values, ValueMesh) else ValueMesh(extent, values)
        self._cluster().flush_logs(timeout=EXEC_FLUSH_S)  # what the cell printed comes before its values
        self._show_values(runner.name, ranks, list(result.values()))
        self.shell.user_ns["_"] = result
        return None

    @staticmethod
    def _show_values(mesh: str, ranks: list[int], values: list) -> None:
        if all(v is None for v in values):
            return
        groups: dict[str, list[int]] = {}
        for rank, value in zip(ranks, values):
            if value is not None:
                groups.setdefault(repr(value), []).append(rank)
        for text, group in groups.items():
            print(f"[{mesh} {format_ranks(group)}] {text}")

    @staticmethod
    def _show_failures(mesh: str, ranks: list[int], error: ActorError, cell_file: str) -> None:
        groups: dict[str, list[int]] = {}
        for failure, rank in zip(error.failures, _failed_ranks(ranks, error)):
            text = _cell_frames_only(failure.traceback, cell_file) if failure.traceback else repr(failure.exception)
            groups.setdefault(text, []).append(rank)
        for text, group in groups.items():
            print(f"[{mesh} {format_ranks(group)}] {text.rstrip()}", file=sys.stderr)


def _call_arguments(source: str, ns: dict) -> tuple[list, dict]:
    """Evaluate ``source`` as the arguments of a Python call (``1, 'a b', lr=0.1``) in
    ``ns``; raises ``UsageError`` naming what is wrong."""
    if not source:
        return [], {}
    try:
        call = ast.parse(f"f({source})", mode="eval").body
    except SyntaxError as e:
        raise UsageError(f"%monarch spawn: the arguments after -- are not Python call arguments: {e.msg}") from None
    if not isinstance(call, ast.Call):
        raise UsageError("%monarch spawn: the arguments after -- are not Python call arguments")

    def value(node):
        try:
            return eval(compile(ast.Expression(node), "<%monarch spawn>", "eval"), ns)
        except Exception as e:
            raise UsageError(f"%monarch spawn: can't evaluate {ast.unparse(node)!r}: {e}") from None

    positional = []
    for node in call.args:
        if isinstance(node, ast.Starred):
            positional.extend(value(node.value))
        else:
            positional.append(value(node))
    keywords = {}
    for kw in call.keywords:
        if kw.arg in keywords:
            raise UsageError(f"%monarch spawn: keyword argument {kw.arg!r} is given twice")
        if kw.arg is None:
            keywords.update(value(kw.value))
        else:
            keywords[kw.arg] = value(kw.value)
    return positional, keywords


def _cell_frames_only(traceback: str, cell_file: str) -> str:
    """A remote exec traceback without the frames of monarch_nb's exec machinery: from
    the cell's first frame on, as a notebook shows it (as it is if no frame is the
    cell's)."""
    lines = traceback.rstrip().splitlines()
    first = next((i for i, line in enumerate(lines) if line.lstrip().startswith(f'File "{cell_file}"')), None)
    return "\n".join(lines if first is None else [lines[0]] + lines[first:])


def _failed_ranks(ranks: list[int], error: ActorError) -> list[int]:
    """The proc ranks of an exec's failures (their points index the ranks it ran on)."""
    return [ranks[f.point.rank] for f in error.failures]


class _Gathered:
    """Futures of single ranks seen as one: ``get()`` returns their values in order and
    raises one :class:`ActorError` with every failed rank."""

    def __init__(self, mesh: str, futures):
        self.mesh = mesh
        self.futures = futures

    def get(self, timeout: float | None = None) -> list:
        extent = Extent({"ranks": len(self.futures)})
        values, failures = [], []
        for i, future in enumerate(self.futures):
            try:
                values.append(future.get(timeout))
            except ActorError as e:
                values.append(None)
                failures += [RemoteFailure(extent.point(i), f.exception, f.traceback) for f in e.failures]
        if failures:
            raise ActorError(self.mesh, "exec", failures, len(self.futures))
        return values
