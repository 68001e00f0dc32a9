"""A proc's debugger: its own DAP session with the in-process debugpy.

- Arming on demand: the first ``breakpoint()``, a breakpoint set from a client that
  concerns an actor of this proc, or post-mortem mode starts debugpy (see
  ``arming``) and connects this session. Until then nothing is traced.
- Stops: when debugpy reports a thread ``stopped``, the session finds which actor
  it is (mesh, rank, the endpoint call running), marks it paused for the health tree
  (``proc.activity``) and registers the stop with the hub (``debug_stopped``); when
  the thread runs again, ``debug_resumed``.
- Requests from clients (``op: "debug"`` on the proc's control inbox, actions in
  ``protocol.debug``): ``where``, ``locals``, ``eval``, ``step``/``next``/``out``,
  ``continue``, ``config`` (breakpoints and post-mortem from the hub) and the IDE relay
  (``relay_*``).

The proc runtime does not know this module: :func:`install` (called by the proc's entry
point) plugs it into the proc server's op table and hooks.

DAP traffic runs on the session's reader thread; everything else on one worker
thread, so the proc's control loop never waits on the debugger.
"""

from __future__ import annotations

import linecache
import os
import queue
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

from .. import cluster_dir
from ..proc import activity
from ..proc.actor import current_context, proc_identity
from ..proc.actor_loop import send_reply
from ..protocol import debug as debug_ops
from ..protocol import envelope, hub_ops, proc_ops
from ..wire import frames as wire_frames
from . import arming, binding, pydevd_adapter
from .dap import DapClient, DapError
from .mux import Mux

STEP_WAIT_S = 2.0  # how long step/next/out wait for the thread to stop again before saying "running"
REQUEST_TIMEOUT_S = 30.0
STACK_LEVELS = 64
RECHECK_S = (0.05, 0.25, 1.0)  # after a resume, when to untrace threads again (s)


def on_rank(mesh: str, ranks) -> bool:
    """Breakpoint condition: is this thread's actor in ``mesh`` (at one of ``ranks``,
    ``None``: any)? Evaluated by debugpy in the thread that reached the line."""
    ctx = current_context()
    if ctx is None or ctx.actor_instance.mesh_name != mesh:
        return False
    return ranks is None or ctx.actor_instance.rank.rank in ranks


def _condition(bp: dict) -> str | None:
    parts = []
    if bp.get("mesh") is not None:
        ranks = tuple(bp["ranks"]) if bp.get("ranks") is not None else None
        parts.append(f"__import__('monarch_nb.debug.session', fromlist=['on_rank']).on_rank({bp['mesh']!r}, {ranks!r})")
    if bp.get("condition"):
        parts.append(f"({bp['condition']})")
    return " and ".join(parts) or None


class ProcDebugger:
    """The debugger of one proc (a singleton: see :func:`debugger`)."""

    def __init__(self, server):
        self.server = server  # the ProcServer: its actors, outbox, address
        self.client: DapClient | None = None
        self.capabilities: dict = {}
        self.config: dict = {"breakpoints": [], "post_mortem": False}
        self.stops: dict[int, dict] = {}  # DAP thread id -> the stop registered with the hub
        self.mux = Mux(self)
        self._arm_lock = threading.RLock()
        self._arm_error: str | None = None
        self._names: dict[int, str] = {}  # DAP thread id -> thread name
        self._applied: set[str] = set()  # files we set breakpoints in
        self._files: dict[int, str] = {}  # breakpoint id -> the file it is set in here (``binding``)
        self._bound: dict[int, str] = {}  # breakpoint id -> the file, where the actors here run that code
        self._lines: dict[int, int] = {}  # breakpoint id -> its line there, when not its own (``binding.bind_function``)
        self._steps: dict[int, tuple[dict, float]] = {}  # DAP thread id -> (request header, deadline)
        self._pm_endpoint: dict[int, str] = {}  # thread ident -> endpoint that raised (post-mortem)
        self._stopping: set[int] = set()  # threads between breakpoint() and their stop: keep tracing
        self._trace_lock = threading.Lock()
        self._traced = False  # every thread traced (after arming, or for breakpoints)
        self._rechecks: list[float] = []  # when to untrace again after a resume (monotonic s)
        self._work: queue.Queue = queue.Queue()
        # action -> handler(header), on the control loop's thread (see handle)
        self._actions = {debug_ops.STOPS: self._stops, debug_ops.CONFIG: self._config,
                         **{relay: self.mux.handle for relay in debug_ops.RELAY_ACTIONS}}
        # action about a paused thread -> handler(header, stop), on the worker thread
        self._thread_actions = {debug_ops.WHERE: self._where, debug_ops.LOCALS: self._locals,
                                debug_ops.EVAL: self._eval,
                                **{step: self._step for step in debug_ops.STEPPING}}
        worker = threading.Thread(target=self._worker, name="monarch-nb-debug", daemon=True)
        pydevd_adapter.hide_thread(worker)
        worker.start()

    # arming ------------------------------------------------------------------------
    @property
    def armed(self) -> bool:
        return self.client is not None and not self.client.closed

    def arm(self) -> None:
        """Start debugpy in this proc and connect this session (idempotent; ~0.2 s the
        first time). Raises ``RuntimeError`` when debugpy can't be started."""
        with self._arm_lock:
            if self.client is not None:
                return
            if self._arm_error is not None:
                raise RuntimeError(self._arm_error)
            try:
                # pydevd on a socketpair: no port, so no other process can reach it.
                client = DapClient(pydevd_adapter.connect_private(), self._on_message, name="monarch-nb-dap")
                self.capabilities = client.request("initialize", clientID="monarch_nb", adapterID="debugpy",
                                                   pathFormat="path", linesStartAt1=True, columnsStartAt1=True)
                client.request("attach", justMyCode=True, stopAllThreadsOnSuspend=False,
                               steppingResumesAllThreads=False, redirectOutput=False, subProcess=False,
                               rules=[{"path": arming.RUNTIME_DIR, "include": False}])
                client.request("configurationDone")
            except ImportError as e:
                self._arm_error = (f"debugpy can't be imported in this proc's Python ({e}); "
                                   "install it (pip install debugpy) to debug actors")
                raise RuntimeError(self._arm_error) from None
            except (OSError, DapError, RuntimeError) as e:
                self._arm_error = f"could not start debugpy in this proc: {e}"
                raise RuntimeError(self._arm_error) from None
            self.client = client
            self._traced = True  # starting pydevd traced every thread
            arming.install_hook(breakpointhook)

    # entry points from the proc --------------------------------------------------------
    def breakpoint(self, frame) -> None:
        """``breakpoint()`` in ``frame``: pause this thread there until continued."""
        try:
            self.arm()
        except RuntimeError as e:
            print(f"monarch_nb: breakpoint() at {frame.f_code.co_filename}:{frame.f_lineno} not taken: {e}",
                  file=sys.stderr, flush=True)
            return
        with self._trace_lock:  # not untraced between here and the stop (see _untrace_if_idle)
            self._stopping.add(threading.get_ident())
        pydevd_adapter.stop_here(frame)

    def endpoint_failed(self, exc: BaseException, endpoint: str) -> None:
        """Post-mortem: with it on, pause this thread in the frame that raised ``exc``
        before the error goes back to the caller."""
        if not self.config.get("post_mortem") or isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return
        try:
            self.arm()
        except RuntimeError as e:
            print(f"monarch_nb: post-mortem not possible: {e}", file=sys.stderr, flush=True)
            return
        ident = threading.get_ident()
        self._pm_endpoint[ident] = endpoint
        try:
            pydevd_adapter.post_mortem(exc)
        finally:
            self._pm_endpoint.pop(ident, None)

    def handle(self, header: dict) -> None:
        """A ``debug`` request from the control loop; never blocks it. Actions about a
        paused thread go to the worker (which answers an unknown one with an error)."""
        action = header.get(debug_ops.ACTION, "")
        self._actions.get(action, self._queue_request)(header)

    def _stops(self, header: dict) -> None:
        """A recovered hub asks what is paused here (answered in the header: it never unpickles)."""
        send_reply(self.server.outbox, self.server.cluster_id, _reply_to(header), 0,
                   extra={"stops": list(self.stops.values())})

    def _config(self, header: dict) -> None:
        self.config = header[debug_ops.CONFIG]
        if self._relevant():
            self._work.put(("config", header))
        elif envelope.PORT in header:
            self._reply(header, {"armed": self.armed})

    def _queue_request(self, header: dict) -> None:
        self._work.put(("request", header))

    def on_spawn(self, header: dict) -> None:
        """An actor is about to start here: apply the cluster's breakpoints first, so
        that one in its ``__init__`` or first call is not missed (arms only if one
        concerns it)."""
        if proc_ops.DEBUG_CONFIG in header:
            self.config = header[proc_ops.DEBUG_CONFIG]
        meshes = {a for a in self.server.actors} | {header[proc_ops.MESH]}
        if self._relevant(meshes):
            try:
                self._apply_config(meshes)
            except (RuntimeError, DapError) as e:
                print(f"monarch_nb: breakpoints not set: {e}", file=sys.stderr, flush=True)

    # DAP events ------------------------------------------------------------------------
    def _on_message(self, message: dict) -> None:
        """Reader thread: IDE sessions see every event at once; the worker handles ours."""
        if message.get("type") == "event" and message.get("event") != "_closed":
            self.mux.on_event(message)
        self._work.put(("event", message))

    def _worker(self) -> None:
        while True:
            try:
                self._work_once()
            except Exception:  # noqa: BLE001 - a bug or a malformed request must not end the proc's debugger
                traceback.print_exc()

    def _work_once(self) -> None:
        timeout = None
        wake_at = [d for _, d in self._steps.values()] + self._rechecks
        if wake_at:
            timeout = max(0.0, min(wake_at) - time.monotonic())
        try:
            kind, item = self._work.get(timeout=timeout)
        except queue.Empty:
            kind, item = None, None
        try:
            if kind == "event":
                self._event(item)
            elif kind == "request":
                self._request(item)
            elif kind == "config":
                self._apply_config()
                self._reply(item, {"armed": self.armed}, extra={debug_ops.BOUND: sorted(self._bound.items())})
        except Exception as e:  # keep serving; the requester gets the error
            if kind in ("request", "config") and _reply_to(item) is not None:
                self._reply(item, {"error": f"{type(e).__name__}: {e}"})
            else:
                traceback.print_exc()
        due = [t for t in self._rechecks if t <= time.monotonic()]
        if kind is not None or due:
            self._rechecks = [t for t in self._rechecks if t not in due]
            self._untrace_if_idle()
        now = time.monotonic()
        for tid, (header, deadline) in list(self._steps.items()):
            if deadline <= now:
                del self._steps[tid]
                self._reply(header, {"running": True})

    def _event(self, message: dict) -> None:
        event, body = message.get("event"), message.get("body") or {}
        if event == "stopped":
            tid = body.get("threadId")
            if tid is None:
                return
            stop = self._describe(tid, body)
            self.stops[tid] = stop
            with self._trace_lock:
                self._stopping.discard(stop["ident"])
            activity.set_paused(stop["ident"], {"file": stop["file"], "line": stop["line"],
                                                "function": stop["function"]})
            self._tell_hub({envelope.OP: hub_ops.DEBUG_STOPPED, "stop": stop})
            step = self._steps.pop(tid, None)
            if step is not None:
                self._reply(step[0], {"stop": stop})
        elif event == "continued":
            tids = list(self.stops) if body.get("allThreadsContinued") else [body.get("threadId")]
            self._resumed(tids)
        elif event == "thread" and body.get("reason") == "exited":
            self._names.pop(body.get("threadId"), None)
            self._resumed([body.get("threadId")])
        elif event == "_closed":
            self._resumed(list(self.stops))

    def _resumed(self, tids) -> None:
        keys = []
        for tid in tids:
            stop = self.stops.pop(tid, None)
            if stop is not None:
                activity.set_paused(stop["ident"], None)
                keys.append(stop["key"])
        if keys:
            self._tell_hub({envelope.OP: hub_ops.DEBUG_RESUMED, "keys": keys})
            # A resumed thread may set its trace function again on its way out of
            # debugpy's suspend loop, after we untraced it: look again a little later.
            now = time.monotonic()
            self._rechecks = [now + d for d in RECHECK_S]

    def _thread_name(self, tid: int) -> str:
        if tid not in self._names:
            self._names = {t["id"]: t["name"] for t in self.client.request("threads")["threads"]}
        return self._names.get(tid, f"thread {tid}")

    def _describe(self, tid: int, body: dict) -> dict:
        """The registry entry for DAP thread ``tid``, which just stopped."""
        name = self._thread_name(tid)
        frames = self.client.request("stackTrace", threadId=tid, startFrame=0, levels=1)["stackFrames"]
        top = frames[0] if frames else {}
        thread = next((t for t in threading.enumerate() if t.name == name), None)
        ident = thread.ident if thread is not None else None
        actor = next((a for a in list(self.server.actors.values()) if a.thread.ident == ident), None)
        current = actor.current if actor is not None else None
        endpoint = current[0] if current else self._pm_endpoint.get(ident)
        identity = proc_identity() or {}
        text = body.get("text") or body.get("description")
        if body.get("reason") == "exception":
            try:
                info = self.client.request("exceptionInfo", threadId=tid)
                text = f"{info.get('exceptionId', '')}: {info.get('description', '')}".strip(": ")
            except DapError:
                pass
        return {
            "key": f"{self.server.proc_id}/{tid}", "proc_id": self.server.proc_id, "address": self.server.address,
            "pid": os.getpid(), "host": socket.gethostname(), "cwd": os.getcwd(),
            "proc_mesh": identity.get("proc_id", self.server.proc_id).rpartition("/")[0],
            "thread": name, "dap_thread": tid, "ident": ident,
            "mesh": actor.mesh_name if actor is not None else None,
            "rank": actor.point.rank if actor is not None else None,
            "point": dict(actor.point) if actor is not None else {},
            "file": (top.get("source") or {}).get("path"), "line": top.get("line"), "function": top.get("name"),
            "endpoint": endpoint, "call_since": current[1] if current else None,
            "reason": body.get("reason"), "text": text,
            "since": time.time(),
        }

    # requests from clients -----------------------------------------------------------
    def _stop_of(self, header: dict) -> dict | None:
        stop = self.stops.get(header.get(debug_ops.DAP_THREAD))
        if stop is None:
            self._reply(header, {"error": "not paused (it was continued, or its thread ended)", "not_paused": True})
        return stop

    def _top_frame(self, tid: int) -> dict:
        frames = self.client.request("stackTrace", threadId=tid, startFrame=0, levels=1)["stackFrames"]
        if not frames:
            raise DapError("the paused thread shows no user frame")
        return frames[0]

    def _request(self, header: dict) -> None:
        action = header.get(debug_ops.ACTION)
        if action == debug_ops.CONTINUE:
            self._continue(header)
            return
        handler = self._thread_actions.get(action)
        if handler is None:
            self._reply(header, {"error": f"unknown debug action {action!r}"})
            return
        stop = self._stop_of(header)
        if stop is not None:
            handler(header, stop)

    def _continue(self, header: dict) -> None:
        stop = self.stops.get(header.get(debug_ops.DAP_THREAD))
        if stop is None:  # continued already: a second continue is harmless
            self._reply(header, {"continued": False})
            return
        self.client.request("continue", threadId=stop["dap_thread"], singleThread=True)
        pydevd_adapter.wake(stop["ident"])
        self._resumed([stop["dap_thread"]])  # now, not when the event comes: a second continue is a no-op
        self._reply(header, {"continued": True})

    def _where(self, header: dict, stop: dict) -> None:
        frames = self.client.request("stackTrace", threadId=stop["dap_thread"], startFrame=0,
                                     levels=STACK_LEVELS)["stackFrames"]
        out = []
        for f in frames:
            path = (f.get("source") or {}).get("path")
            source = linecache.getline(path, f["line"]).rstrip() if path and f.get("line") else ""
            out.append({"file": path, "line": f.get("line"), "function": f.get("name"), "source": source})
        self._reply(header, {"frames": out, "stop": stop})

    def _locals(self, header: dict, stop: dict) -> None:
        frame = self._top_frame(stop["dap_thread"])
        scopes = self.client.request("scopes", frameId=frame["id"])["scopes"]
        local = next((s for s in scopes if s.get("name", "").lower().startswith("locals")), scopes[0] if scopes else None)
        variables = [] if local is None else self.client.request(
            "variables", variablesReference=local["variablesReference"])["variables"]
        self._reply(header, {"locals": [{"name": v["name"], "type": v.get("type", ""), "value": v.get("value", "")}
                                        for v in variables if not v["name"].startswith("special variables")
                                        and not v["name"].startswith("function variables")],
                             "stop": stop})

    def _eval(self, header: dict, stop: dict) -> None:
        frame = self._top_frame(stop["dap_thread"])
        try:
            body = self.client.request("evaluate", expression=header[debug_ops.EXPRESSION], frameId=frame["id"],
                                       context="repl", timeout=REQUEST_TIMEOUT_S)
            self._reply(header, {"result": body.get("result", ""), "type": body.get("type")})
        except DapError as e:
            self._reply(header, {"error": str(e)})

    def _step(self, header: dict, stop: dict) -> None:
        """step, next, out: answered with the next stop, or ``running`` after ``wait_s``."""
        tid = stop["dap_thread"]
        command = {debug_ops.STEP: "stepIn", debug_ops.NEXT: "next", debug_ops.OUT: "stepOut"}[header[debug_ops.ACTION]]
        self._steps[tid] = (header, time.monotonic() + float(header.get(debug_ops.WAIT_S, STEP_WAIT_S)))
        try:
            self.client.request(command, threadId=tid, singleThread=True)
            pydevd_adapter.wake(stop["ident"])
        except DapError:
            self._steps.pop(tid, None)
            raise

    # breakpoints from the hub ----------------------------------------------------------
    def _relevant(self, meshes=None) -> bool:
        """Does the configuration concern this proc (so that it is worth arming)?"""
        if self.armed:
            return True
        meshes = set(self.server.actors) if meshes is None else meshes
        return bool(self.config.get("post_mortem")) or any(
            b.get("mesh") is None or b["mesh"] in meshes for b in self.config.get("breakpoints", []))

    def _apply_config(self, meshes=None) -> None:
        meshes = set(self.server.actors) if meshes is None else meshes
        if not self._relevant(meshes):
            return
        self.arm()
        actors = dict(self.server.actors)
        by_file: dict[str, list[dict]] = {}
        self._files, self._bound, self._lines = {}, {}, {}
        for bp in self.config.get("breakpoints", []):
            if bp.get("mesh") is None or bp["mesh"] in meshes:
                concerned = [a for name, a in actors.items() if bp.get("mesh") in (None, name)
                             and (bp.get("ranks") is None or a.point.rank in bp["ranks"])]
                classes = [a.actor_class for a in concerned if a.actor_class is not None]
                bound = None
                function = bp.get(hub_ops.BREAKPOINT_FUNCTION)
                found = binding.bind_function(function, classes) if concerned and function else None
                if found is not None:  # the same function, perhaps in another cell now, at another line
                    bound, self._lines[bp["id"]], text = found
                    if bound != bp["file"] or not bp.get("source"):
                        arming.materialize(bound, text)
                elif concerned:
                    bound = binding.bind(bp["file"], bool(bp.get("source")), binding.code_files(classes))
                # Not bound (yet): where it was set, for an actor about to start with that code.
                file = self._files[bp["id"]] = bound or bp["file"]
                if bound is not None:
                    self._bound[bp["id"]] = bound
                by_file.setdefault(file, []).append(bp)
                if bp.get("source") and (found is None or bound == bp["file"]):
                    arming.materialize(file, bp["source"])
        for path in set(by_file) | self._applied:
            self.set_source_breakpoints(path)
        self._applied = set(by_file)

    def ours(self, path: str) -> list[dict]:
        """The cluster's breakpoints in ``path`` as DAP ``SourceBreakpoint`` s."""
        meshes = set(self.server.actors)
        return [{"line": self._lines.get(bp["id"], bp["line"]), **({"condition": c} if (c := _condition(bp)) else {})}
                for bp in self.config.get("breakpoints", [])
                if self._files.get(bp["id"], bp["file"]) == path and (bp.get("mesh") is None or bp["mesh"] in meshes)]

    def set_source_breakpoints(self, path: str) -> None:
        """Send debugpy every breakpoint in ``path``: the cluster's and each IDE's."""
        wanted = self.ours(path) + self.mux.breakpoints(path)
        if wanted:
            self.ensure_traced()
        self.client.request("setBreakpoints", source={"path": path}, breakpoints=wanted)

    # tracing -----------------------------------------------------------------------------
    def ensure_traced(self) -> None:
        """Every thread traced again (breakpoints are only checked in traced threads)."""
        with self._trace_lock:
            if not self._traced:
                self._traced = pydevd_adapter.retrace_all()

    def _untrace_if_idle(self) -> None:
        """Nothing to stop for (no paused thread, no step under way, no breakpoint of the
        cluster or of an IDE, no breakpoint() about to stop): untrace every thread, so
        that the proc runs at full speed (see ``pydevd_adapter.untrace_all``)."""
        if not self.armed or self.stops or self._steps or self._applied or self.mux.sessions:
            return
        with self._trace_lock:
            if self._stopping:
                return
            # False (reported once by the adapter): pydevd changed, the proc stays traced.
            if pydevd_adapter.untrace_all():
                self._traced = False

    # replies and the hub ---------------------------------------------------------------
    def _reply(self, header: dict, value: dict, extra: dict | None = None) -> None:
        """Answer ``header``'s request with ``value`` (``extra``: header fields, which the
        hub reads without unpickling), if it says where (a reply address and port)."""
        reply_to = _reply_to(header)
        if reply_to is not None:
            send_reply(self.server.outbox, self.server.cluster_id, reply_to, 0, value=value, extra=extra)

    def _tell_hub(self, header: dict) -> None:
        identity = proc_identity()
        if identity is None:  # actors in a client's own process (this_proc()): no hub
            return
        try:
            hub = cluster_dir.read_info(Path(identity["cluster_dir"]))["hub"]
        except (OSError, ValueError, KeyError):
            return
        self.server.outbox.send(hub, wire_frames.encode(self.server.cluster_id, header))


_debugger: ProcDebugger | None = None
_lock = threading.Lock()


def debugger(server=None) -> ProcDebugger | None:
    """This proc's debugger, made on first use with ``server`` (``None`` before)."""
    global _debugger
    with _lock:
        if _debugger is None and server is not None:
            _debugger = ProcDebugger(server)
        return _debugger


def breakpointhook(*args, **kwargs) -> None:
    """``sys.breakpointhook`` of a proc: ``breakpoint()`` pauses the calling thread
    under debugpy, registered with the hub, never silently ignored.
    ``PYTHONBREAKPOINT=0`` turns it off, as for pdb."""
    if os.environ.get("PYTHONBREAKPOINT") == "0":
        return
    session = debugger()
    if session is None:
        print("monarch_nb: breakpoint() outside a proc's actors is not handled by monarch_nb", file=sys.stderr)
        return
    session.breakpoint(sys._getframe(1))


def install(server) -> None:
    """At proc start, into the proc server ``server``: its ``debug`` op, the cluster's
    breakpoints before each actor starts, post-mortem when an endpoint raises; and
    ``breakpoint()`` goes to this proc's debugger (armed on first use)."""
    session = debugger(server)
    server.ops[proc_ops.DEBUG] = lambda message: session.handle(message.header)
    server.spawn_hooks.append(_before_spawn)
    server.endpoint_error_hooks.append(_endpoint_failed)
    arming.install_hook(breakpointhook)


def _before_spawn(header: dict) -> None:
    """An actor is about to start here (``spawn_actor``)."""
    session = debugger()
    if session is not None and (proc_ops.DEBUG_CONFIG in header or session.armed):
        session.on_spawn(header)


def _endpoint_failed(exc: BaseException, endpoint: str) -> None:
    """An endpoint raised (in its actor's thread, before the error is replied)."""
    session = _debugger
    if session is not None and session.config.get("post_mortem"):
        session.endpoint_failed(exc, endpoint)


def _reply_to(header: dict) -> tuple[str, int] | None:
    """Where a request wants its answer, or ``None`` when it does not say in full (a
    signed but malformed request: a port without an address used to end the thread)."""
    reply, port = header.get(envelope.REPLY), header.get(envelope.PORT)
    return (reply, port) if isinstance(reply, str) and isinstance(port, int) else None
