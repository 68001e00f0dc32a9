"""``cluster.debugger``: paused ranks of a cluster, seen and driven from the client.

The list of paused ranks comes from the hub's debug registry (and its
``debug_changed`` events); where/locals/eval/step/continue go straight to each
rank's proc, in parallel across ranks. Breakpoints and post-mortem mode are the
cluster's (kept by the hub, so they outlive this client).
"""

from __future__ import annotations

import ast
import inspect
import linecache
import os
import socket
import textwrap
import threading
import time
from dataclasses import dataclass, fields
from typing import Callable

from ..debug import binding
from ..errors import ClusterError, InvalidRequest
from ..mesh.ranks import format_ranks, parse_ranks
from ..protocol import debug as debug_actions
from ..protocol import envelope, events, hub_ops, proc_ops
from ..wire.mailbox import Gather
from .runtime import runtime

REQUEST_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Stop:
    """One paused thread: ``mesh``/``rank`` of its actor (``None`` for a thread that
    is not an actor's), ``host``, ``pid``, ``thread``, where it stopped (``file``,
    ``line``, ``function``), the ``endpoint`` call it was handling, ``since`` (epoch
    seconds), ``reason`` (breakpoint, step, exception, ...) and ``text`` (the
    exception, for post-mortem stops)."""

    key: str
    mesh: str | None
    rank: int | None
    host: str
    pid: int
    proc_id: str
    thread: str
    file: str | None
    line: int | None
    function: str | None
    endpoint: str | None
    since: float
    reason: str | None
    text: str | None
    address: str
    dap_thread: int
    cwd: str | None = None
    host_id: str | None = None

    @classmethod
    def from_entry(cls, entry: dict) -> "Stop":
        return cls(**{f.name: entry.get(f.name) for f in fields(cls)})

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def who(self) -> str:
        return f"{self.mesh} rank {self.rank}" if self.mesh is not None else f"{self.proc_id} thread {self.thread}"

    def __str__(self) -> str:
        call = f" in {self.endpoint}()" if self.endpoint else ""
        reason = f"{self.reason} ({self.text})" if self.text else self.reason
        return (f"{self.who} (pid {self.pid} on {self.host}) paused at {os.path.basename(self.file or '?')}:"
                f"{self.line} {self.function}{call}, {reason}, for {time.time() - self.since:.1f} s")


@dataclass(frozen=True)
class Frame:
    file: str | None
    line: int | None
    function: str | None
    source: str  # the line's text ("" when unknown)


class EvalResults(dict):
    """``(mesh, rank) -> result text`` of one expression on several paused ranks;
    shown side by side, ranks with equal results folded into one line. Errors are
    kept as ``"<error> ..."`` texts (``errors`` holds their keys)."""

    def __init__(self, expression: str):
        super().__init__()
        self.expression = expression
        self.errors: set = set()
        self.not_paused: tuple[str, list[int]] | None = None  # (mesh, ranks) selected but not paused

    def folded(self) -> list[tuple[str, list[int], str]]:
        """``(mesh, ranks, text)`` groups, in rank order of their first member."""
        groups: dict[tuple, list[int]] = {}
        for (mesh, rank), text in sorted(self.items(), key=lambda kv: (kv[0][0] or "", kv[0][1] or 0)):
            groups.setdefault((mesh, text), []).append(rank)
        return [(mesh, ranks, text) for (mesh, text), ranks in groups.items()]

    def __repr__(self) -> str:
        lines = [f"[{mesh} {format_ranks([r for r in ranks if r is not None])}] {text}"
                 for mesh, ranks, text in self.folded()]
        if self.not_paused:
            mesh, ranks = self.not_paused
            lines.append(f"({mesh} rank(s) {format_ranks(ranks)} not paused: not evaluated)")
        return "\n".join(lines) if lines else f"(no paused rank evaluated {self.expression!r})"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))


def _ranks_of(ranks) -> list[int] | None:
    if ranks is None:
        return None
    if isinstance(ranks, int):
        return [ranks]
    if isinstance(ranks, str):
        return parse_ranks(ranks)
    return sorted(set(int(r) for r in ranks))


def _mesh_name(mesh) -> str | None:
    return mesh if mesh is None or isinstance(mesh, str) else getattr(mesh, "name", None) or mesh._name


class Debugger:
    """Debugging of one cluster's procs (``cluster.debugger``)."""

    def __init__(self, cluster):
        self._cluster = cluster
        self._cluster_id = cluster._info["cluster_id"]
        self._cond = threading.Condition()
        self._stops: dict[str, dict] | None = None  # the newest list heard of (events, replies)
        self._seq: tuple[str, int] | None = None  # its version: (hub epoch, changes)
        self._watchers: list[Callable[[list[Stop]], None]] = []
        self._unsubscribe = runtime().events.subscribe(self._on_event)

    def _on_event(self, event: dict) -> None:
        if event.get(envelope.OP) != events.DEBUG_CHANGED or event.get(events.CLUSTER) != self._cluster_id:
            return
        with self._cond:
            if not self._keep(event["stops"], event.get(events.SEQ)):
                return  # a listing newer than this event came first
            self._cond.notify_all()
            watchers = list(self._watchers)
        stops = [Stop.from_entry(s) for s in event["stops"]]
        for callback in watchers:
            callback(stops)

    # the list ------------------------------------------------------------------------
    def paused(self, mesh=None, ranks=None) -> list[Stop]:
        """Paused threads, by mesh and rank (one hub round trip); only those of
        ``mesh`` (a name or handle) and ``ranks`` (int, list or ``"0-3,5"``) when given."""
        reply = self._cluster.hub.request(hub_ops.DEBUG_PAUSED, timeout=REQUEST_TIMEOUT_S)
        with self._cond:
            self._keep(reply["stops"], reply.get(events.SEQ))
            entries = list(self._stops.values())  # an event that came while we asked may be newer
        return self._select([Stop.from_entry(s) for s in entries], mesh, ranks)

    def _keep(self, entries: list[dict], seq) -> bool:
        """Hold ``entries`` as the list unless the one held is newer (an event and a
        listing cross on the way); call with ``_cond`` held. True if kept."""
        seq = tuple(seq) if seq else None
        if seq is not None and self._seq is not None and seq[0] == self._seq[0] and seq[1] < self._seq[1]:
            return False
        self._stops, self._seq = {s["key"]: s for s in entries}, seq
        return True

    @staticmethod
    def _select(stops: list[Stop], mesh, ranks) -> list[Stop]:
        name, wanted = _mesh_name(mesh), _ranks_of(ranks)
        return [s for s in stops if (name is None or s.mesh == name) and (wanted is None or s.rank in wanted)]

    def wait_paused(self, count: int = 1, mesh=None, timeout: float = 60.0) -> list[Stop]:
        """Block until at least ``count`` threads (of ``mesh``) are paused; returns them.
        Raises ``TimeoutError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        stops = self.paused(mesh)
        while len(stops) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(stops)} of {count} rank(s) paused after {timeout} s")
            with self._cond:
                self._cond.wait(min(left, 0.5))
                cached = None if self._stops is None else list(self._stops.values())
            stops = (self._select([Stop.from_entry(s) for s in cached], mesh, None) if cached is not None
                     else self.paused(mesh))
        return stops

    def watch(self, callback: Callable[[list[Stop]], None]) -> Callable[[], None]:
        """Call ``callback(stops)`` with the whole list whenever it changes (on the event
        thread: return quickly). Returns a function that stops watching."""
        with self._cond:
            self._watchers.append(callback)

        def unwatch() -> None:
            with self._cond:
                if callback in self._watchers:
                    self._watchers.remove(callback)

        return unwatch

    def _targets(self, mesh, ranks, what: str, missing: list[int] | None = None) -> list[Stop]:
        """The paused actor threads of ``mesh`` at ``ranks`` (``None``: every paused one);
        ``InvalidRequest`` naming a rank the mesh does not have, or what is not paused.
        Given a ``missing`` list, ranks not paused go there instead, and only none
        paused at all raises."""
        name = _mesh_name(mesh)
        if name is None:
            raise InvalidRequest(f"{what}: which mesh? pass the actor mesh (name or handle)")
        stops = self.paused(name)
        by_rank: dict[int, Stop] = {}
        for s in stops:
            by_rank.setdefault(s.rank, s)  # an actor's own thread first (ordered by the hub)
        wanted = _ranks_of(ranks)
        if wanted is None:
            if not by_rank:
                raise InvalidRequest(f"{what}: no rank of {name!r} is paused")
            return [by_rank[r] for r in sorted(by_rank, key=lambda r: -1 if r is None else r)]
        absent = [r for r in wanted if r not in by_rank]
        if absent:
            size = self._size(name)
            beyond = [r for r in absent if size is not None and not 0 <= r < size]
            if beyond:
                raise InvalidRequest(f"{what}: no rank {format_ranks(beyond)} in {name!r} (ranks 0-{size - 1})")
            if missing is None or len(absent) == len(wanted):
                paused = format_ranks([r for r in by_rank if r is not None]) or "none"
                raise InvalidRequest(f"{what}: rank(s) {format_ranks(absent)} of {name!r} are not paused "
                                     f"(paused: {paused})")
            missing.extend(absent)
        return [by_rank[r] for r in wanted if r in by_rank]

    def _size(self, name: str) -> int | None:
        """How many actors mesh ``name`` has (``None``: unknown to the hub)."""
        try:
            return len(self._cluster.actor_meshes[name])
        except (KeyError, ClusterError):
            return None

    def _one(self, mesh, rank, what: str) -> Stop:
        if rank is None:
            raise InvalidRequest(f"{what}: which rank? pass one rank")
        return self._targets(mesh, [rank], what)[0]

    # talking to procs ------------------------------------------------------------------
    def _ask(self, stops: list[Stop], action: str, timeout: float = REQUEST_TIMEOUT_S, **fields) -> list[dict]:
        """Send ``action`` to every stop's proc at once; their answers in order. A proc
        that does not answer within ``timeout`` s (or whose stop vanished: it died)
        gets ``{"error": ...}``."""
        replies: dict[int, dict] = {}

        def on_reply(i, message) -> None:
            try:
                replies[i] = message.value()
            except Exception as e:  # noqa: BLE001 - a reply we can't read
                replies[i] = {"error": f"unreadable reply: {e}"}

        # A stop that left the hub's list while we wait on an inspection means its proc
        # died (a step or continue takes it off the list on purpose: wait for those).
        vanish_ends = action in ("where", "locals", "eval")

        def settled() -> bool:
            with self._cond:
                live = self._stops
            return all(i in replies or (vanish_ends and live is not None and s.key not in live)
                       for i, s in enumerate(stops))

        # Every port opens inside ``with``: a send that fails part way closes those already open.
        with Gather(runtime().mailbox, on_reply) as gather:
            for i, stop in enumerate(stops):
                gather.request(stop.address, self._cluster_id,
                               {envelope.OP: proc_ops.DEBUG, debug_actions.ACTION: action,
                                debug_actions.DAP_THREAD: stop.dap_thread, **fields}, key=i)
            deadline = time.monotonic() + timeout
            while not settled() and time.monotonic() < deadline:
                gather.mailbox.wait(settled, min(0.25, max(0.0, deadline - time.monotonic())))
        return [replies.get(i, {"error": f"{s.who}: no answer (its proc died, or took over {timeout} s)"})
                for i, s in enumerate(stops)]

    # inspecting ------------------------------------------------------------------------
    def where(self, mesh, rank: int) -> list[Frame]:
        """The paused rank's stack, innermost frame first, with source lines (from the
        proc, else from this client: code defined in a notebook cell)."""
        answer = self._ask([self._one(mesh, rank, "where")], "where")[0]
        if "error" in answer:
            raise InvalidRequest(f"where {_mesh_name(mesh)} rank {rank}: {answer['error']}")
        return [Frame(f["file"], f["line"], f["function"],
                      f["source"] or (linecache.getline(f["file"], f["line"]).rstrip()
                                      if f["file"] and f["line"] else ""))
                for f in answer["frames"]]

    def locals(self, mesh, rank: int) -> dict[str, str]:
        """Names -> repr texts of the local variables of the paused rank's top frame."""
        answer = self._ask([self._one(mesh, rank, "locals")], "locals")[0]
        if "error" in answer:
            raise InvalidRequest(f"locals {_mesh_name(mesh)} rank {rank}: {answer['error']}")
        return {v["name"]: v["value"] for v in answer["locals"]}

    def eval(self, expression: str, mesh, ranks=None, timeout: float = REQUEST_TIMEOUT_S) -> EvalResults:
        """Evaluate ``expression`` (or run a statement) in the top user frame of every
        selected paused rank, in parallel; results are repr texts. ``ranks=None``: every
        paused rank of ``mesh``. Selected ranks that are not paused are skipped and named
        (``results.not_paused``); ``InvalidRequest`` when none is, or a rank is not in
        the mesh. An expression that fails gives that rank an error text."""
        if not isinstance(expression, str) or not expression.strip():
            raise InvalidRequest("eval needs an expression, e.g. 'loss.item()'")
        missing: list[int] = []
        stops = self._targets(mesh, ranks, "eval", missing)
        results = EvalResults(expression)
        if missing:
            results.not_paused = (_mesh_name(mesh), missing)
        for stop, answer in zip(stops, self._ask(stops, "eval", timeout, expression=expression)):
            if "error" in answer:  # debugpy sends the whole traceback; its last line says it
                lines = [line for line in answer["error"].strip().splitlines() if line.strip()]
                results[(stop.mesh, stop.rank)] = f"<error> {lines[-1] if lines else answer['error']}"
                results.errors.add((stop.mesh, stop.rank))
            else:
                results[(stop.mesh, stop.rank)] = answer["result"]
        return results

    # running ---------------------------------------------------------------------------
    def _move(self, action: str, mesh, ranks, wait_s: float) -> dict[int, Stop | None]:
        stops = self._targets(mesh, ranks, action)
        out: dict[int, Stop | None] = {}
        for stop, answer in zip(stops, self._ask(stops, action, wait_s + REQUEST_TIMEOUT_S, wait_s=wait_s)):
            if "error" in answer and not answer.get("not_paused"):
                raise InvalidRequest(f"{action} {stop.who}: {answer['error']}")
            out[stop.rank] = Stop.from_entry(answer["stop"]) if "stop" in answer else None
        self._wait_listed([s for s in out.values() if s is not None])
        return out

    def step(self, mesh, ranks=None, wait_s: float = 2.0) -> dict[int, Stop | None]:
        """Step into the next call or line on the paused ranks; returns rank -> where it
        stopped next (``None``: still running after ``wait_s`` seconds)."""
        return self._move("step", mesh, ranks, wait_s)

    def next(self, mesh, ranks=None, wait_s: float = 2.0) -> dict[int, Stop | None]:
        """Run to the next line of the same function (see :meth:`step`)."""
        return self._move("next", mesh, ranks, wait_s)

    def step_out(self, mesh, ranks=None, wait_s: float = 2.0) -> dict[int, Stop | None]:
        """Run until the current function returns (see :meth:`step`)."""
        return self._move("out", mesh, ranks, wait_s)

    def continue_(self, mesh, ranks=None) -> list[int]:
        """Let the paused ranks of ``mesh`` (``ranks``, default all) run on; returns the
        ranks continued. Continuing a rank twice is harmless."""
        stops = self._targets(mesh, ranks, "continue")
        answers = self._ask(stops, "continue")
        self._wait_gone(stops)
        return [s.rank for s, a in zip(stops, answers) if a.get("continued")]

    def continue_all(self) -> int:
        """Continue every paused thread of the cluster; returns how many were."""
        stops = self.paused()
        if not stops:
            return 0
        answers = self._ask(stops, "continue")
        self._wait_gone(stops)
        return sum(bool(a.get("continued")) for a in answers)

    def _wait_listed(self, stops: list[Stop], timeout: float = 2.0) -> None:
        """Until the hub's list holds ``stops`` (where a step just paused: the proc tells
        the hub on its own path), so that an inspection right after a step finds them."""
        keys = {s.key for s in stops}
        deadline = time.monotonic() + timeout
        while keys - {s.key for s in self.paused()} and time.monotonic() < deadline:
            with self._cond:
                self._cond.wait(0.02)

    def _wait_gone(self, stops: list[Stop], timeout: float = 2.0) -> None:
        """Until the hub's list no longer holds ``stops`` (procs tell it on their own
        path), so that :meth:`paused` right after a continue does not show them."""
        keys = {s.key for s in stops}
        deadline = time.monotonic() + timeout
        while keys & {s.key for s in self.paused()} and time.monotonic() < deadline:
            with self._cond:
                self._cond.wait(0.02)

    # breakpoints -----------------------------------------------------------------------
    def set_breakpoint(self, where, line: int | None = None, mesh=None, ranks=None,
                       condition: str | None = None) -> dict:
        """Pause when code reaches a line, without editing it. ``where``: ``"FILE:LINE"``,
        a file path (with ``line``), or a function, method or class (``line``: a line of
        its file, default its first body line) — also one defined in a notebook cell
        (the procs run it pickled by value, under the cell's file name; it binds to the
        actors' function of the same name and code, whatever cell it is in). ``mesh``/
        ``ranks``: only those actors stop (default: any thread of any proc);
        ``condition``: a Python expression evaluated in the frame. Notebook code binds
        to the actors' code from the same cell text, also after a kernel restart. Returns
        the breakpoint (``id``, ``file``, ``line``, ..., and ``bound``: one
        ``{"proc_id", "file"}`` per proc whose actors run that code, empty when it bound
        nowhere yet). Raises ``InvalidRequest`` for an
        unknown mesh, ranks outside it, or a condition that is not an expression."""
        file, line = _location(where, line)
        ranks = _ranks_of(ranks)
        # Code from a notebook cell has a file name but no file: its text goes along, and
        # procs write it under that name (as ipykernel's own debugger does) for debugpy,
        # and bind it to the actors' code from the same cell (``debug.binding``). A proc on
        # this machine may have written the file already: IPython's cache entry (no
        # mtime) tells a cell from a file.
        cached = linecache.cache.get(file)
        if cached is not None and cached[1] is None:
            source = "".join(cached[2]) or None
        else:
            source = None if os.path.exists(file) else "".join(linecache.getlines(file)) or None
        function = _function_at(where, line) if source is not None else None
        return self._cluster.hub.request(hub_ops.DEBUG_SET_BREAKPOINT, timeout=REQUEST_TIMEOUT_S, file=file, line=line,
                                         mesh=_mesh_name(mesh), ranks=ranks, condition=condition,
                                         source=source, **{hub_ops.BREAKPOINT_FUNCTION: function})["breakpoint"]

    def breakpoints(self) -> list[dict]:
        """The cluster's breakpoints (``id``, ``file``, ``line``, ``mesh``, ``ranks``, ``condition``)."""
        return self._cluster.hub.request(hub_ops.DEBUG_BREAKPOINTS, timeout=REQUEST_TIMEOUT_S)["breakpoints"]

    def clear_breakpoints(self, ids=None) -> int:
        """Remove breakpoints by id (an int or a list; ``None``: all); returns how many."""
        ids = [ids] if isinstance(ids, int) else (list(ids) if ids is not None else None)
        return self._cluster.hub.request(hub_ops.DEBUG_CLEAR_BREAKPOINTS, timeout=REQUEST_TIMEOUT_S, ids=ids)["cleared"]

    def post_mortem(self, on: bool | None = None) -> bool:
        """Turn post-mortem mode on or off (``None``: just say): with it on, a rank
        whose endpoint raises pauses in the raising frame (listed as paused, reason
        ``exception``) and the caller gets the error once it is continued."""
        if on is None:
            return self._cluster.hub.request(hub_ops.DEBUG_BREAKPOINTS, timeout=REQUEST_TIMEOUT_S)["post_mortem"]
        return self._cluster.hub.request(hub_ops.DEBUG_POST_MORTEM, timeout=REQUEST_TIMEOUT_S,
                                         on=bool(on))["post_mortem"]

    # IDEs ------------------------------------------------------------------------------
    def attach(self, mesh, rank: int, port: int = 0):
        """Open a relay for an IDE to the paused ``rank`` of ``mesh``: a DAP port on this
        client's 127.0.0.1 carried over the cluster's signed channel (the proc may be
        on another host). Only connections from this user's processes are admitted;
        others are refused, said on stderr and counted (``relay.refused``, and the hub's
        ``relay_refused`` in ``cluster.health()["hub"]``). Returns the
        :class:`~monarch_nb.debug.relay.Relay` (``.port``, ``.launch_config()`` for VS
        Code, ``.close()``)."""
        from ..debug.relay import Relay

        stop = self._one(mesh, rank, "attach")
        relay = Relay(self._cluster_id, stop.address, f"{stop.mesh} rank {stop.rank}", port,
                      hub_address=self._cluster._info["hub"])
        relay.remote_cwd = stop.cwd if stop.host != socket.gethostname() else None
        return relay

    def close(self) -> None:
        self._unsubscribe()


def _location(where, line: int | None) -> tuple[str, int]:
    """``(absolute file, line)`` from what :meth:`Debugger.set_breakpoint` accepts."""
    if isinstance(where, str) and line is None:
        path, sep, number = where.rpartition(":")
        if not sep or not number.strip().isdigit():
            raise InvalidRequest(f"breakpoint {where!r}: write FILE:LINE, e.g. train.py:42")
        where, line = path, int(number)
    if isinstance(where, str):
        if line is None:
            raise InvalidRequest(f"breakpoint in {where!r}: which line?")
        path = where if where.startswith("<") else os.path.abspath(os.path.expanduser(where))
        if not where.startswith("<") and not os.path.exists(path) and not linecache.getlines(where):
            raise InvalidRequest(f"breakpoint {where}:{line}: no such file here ({path}); give a path as the "
                                 "procs see it, or the function itself")
        if not os.path.exists(path) and linecache.getlines(where):
            path = where  # a notebook cell's file name: only in linecache
        count = len(linecache.getlines(path))
        if count and not 1 <= line <= count:
            raise InvalidRequest(f"breakpoint {where}:{line}: {where} has lines 1-{count}")
        return path, line
    target = inspect.unwrap(where)
    target = getattr(target, "__func__", target)
    code = getattr(target, "__code__", None)
    if code is not None:
        file, first = code.co_filename, code.co_firstlineno
    else:
        try:
            file = inspect.getsourcefile(target) or inspect.getfile(target)
            _, first = inspect.getsourcelines(target)
        except (TypeError, OSError) as e:
            raise InvalidRequest(f"breakpoint in {where!r}: can't find its source ({e})") from None
    if line is None:
        return file, _first_statement_line(target) or _first_body_line(file, first)
    try:
        last = first + len(inspect.getsourcelines(target)[0]) - 1
    except (TypeError, OSError):
        return file, line
    if not first <= line <= last:  # lines count in the file (a notebook cell), not in the function
        raise InvalidRequest(f"breakpoint in {getattr(target, '__qualname__', where)} at line {line}: it spans "
                             f"lines {first}-{last} of {file}; give one of those")
    return file, line


def _function_at(where, line: int) -> dict | None:
    """The identity (``debug.binding.identity``) of the function holding ``line`` when
    ``where`` is that function, or a class with a method holding it; None otherwise
    (a ``FILE:LINE``: bound by the cell's text)."""
    target = getattr(inspect.unwrap(where), "__func__", inspect.unwrap(where)) if callable(where) else None
    candidates = [target] if inspect.isfunction(target) else []
    if inspect.isclass(target):
        for value in vars(target).values():
            value = getattr(value, "__func__", value)
            value = getattr(value, "fget", value)
            if inspect.isfunction(value):
                candidates.append(inspect.unwrap(value))
    for function in candidates:
        code = function.__code__
        try:
            if code.co_firstlineno <= line < code.co_firstlineno + len(inspect.getsourcelines(code)[0]):
                return binding.identity(function, line)
        except (OSError, TypeError):
            continue
    return None


def _first_statement_line(target) -> int | None:
    """The line (in its file) of the first statement of function ``target``'s body that
    runs: not its docstring, which compiles to no code, so a breakpoint there is never
    hit. A signature ending in a comment, or a body on the ``def`` line, are read right
    (:func:`_first_body_line`, reading lines, put the breakpoint on a later line, or on
    the decorator). ``None`` when the source can't be parsed."""
    try:
        lines, start = inspect.getsourcelines(target)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (TypeError, OSError, SyntaxError):
        return None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    body = node.body
    docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
        and isinstance(body[0].value.value, str)
    statement = body[1] if docstring and len(body) > 1 else body[0]
    return start + statement.lineno - 1


def _first_body_line(file: str, first: int) -> int:
    """The first line after a ``def``'s signature (and docstring is fine to stop on)."""
    lines = linecache.getlines(file)
    i = first - 1
    while i < len(lines) and lines[i].lstrip().startswith("@"):
        i += 1
    depth = 0
    while i < len(lines):
        text = lines[i]
        depth += text.count("(") - text.count(")")
        if depth <= 0 and text.rstrip().endswith(":"):
            return i + 2
        i += 1
    return first
