"""IDE sessions sharing a proc's one debugpy connection.

debugpy in a proc has one DAP client: the proc's own session, which must stay
connected (a DAP ``disconnect`` resumes every thread and drops breakpoints). An IDE
that attaches through a relay (``relay``) gets a *virtual* session here: its
requests go to debugpy under our sequence numbers and the responses come back under
its own; every debugpy event goes to it too. What would disturb the other users of
the proc is answered here instead:

- ``initialize``/``attach``/``launch`` are answered from the proc's own handshake;
  ``configurationDone`` is answered and followed by a ``stopped`` event per thread
  already paused, so the IDE shows them at once.
- ``setBreakpoints`` sends debugpy the union of the cluster's breakpoints and every
  IDE's in that file; the IDE gets back the results for its own.
- ``disconnect``/``terminate`` end only the IDE's session: paused ranks stay paused
  (and listed); exception filters are acknowledged but not applied (post-mortem is
  the cluster's setting).

A session whose relay has not been heard from for ``SESSION_TIMEOUT_S`` (its client
went away) is dropped.
"""

from __future__ import annotations

import threading
import time

from ..protocol import debug as debug_ops
from ..protocol import envelope
from ..wire import frames as wire_frames
from . import arming, pydevd_adapter
from .dap import Parser, encode

SESSION_TIMEOUT_S = 5.0  # relays send relay_alive every second
RESUMING = ("continue", "next", "stepIn", "stepOut")  # requests after which the thread must be woken


class IdeSession:
    def __init__(self, sid: str, address: str):
        self.sid = sid
        self.address = address  # the relay's inbox
        self.parser = Parser()
        self.breakpoints: dict[str, list[dict]] = {}  # file -> the IDE's SourceBreakpoints
        self.last_seen = time.monotonic()
        self.configured = False
        self._seq = 0
        self._lock = threading.Lock()

    def next_seq(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq


class Mux:
    def __init__(self, debugger):
        self.debugger = debugger
        self.sessions: dict[str, IdeSession] = {}
        self._lock = threading.Lock()
        # relay action -> handler(header), on the proc's control loop thread
        self._relay_actions = {debug_ops.RELAY_OPEN: self._relay_open, debug_ops.RELAY_DATA: self._relay_data,
                               debug_ops.RELAY_CLOSE: self._relay_close, debug_ops.RELAY_ALIVE: self._session}
        # DAP command -> handler(session, request); any other goes to debugpy (_forward)
        self._commands = {"initialize": self._initialize, "attach": self._attach, "launch": self._attach,
                          "configurationDone": self._configuration_done, "setBreakpoints": self._set_breakpoints,
                          "setExceptionBreakpoints": self._acknowledge,
                          "setFunctionBreakpoints": self._no_function_breakpoints,
                          "disconnect": self._disconnect, "terminate": self._disconnect}

    # from the relay (control loop thread) ------------------------------------------------
    def handle(self, header: dict) -> None:
        """A relay's message (``protocol.debug.RELAY_*``). One for a session not open
        here (expired, or never opened) is ignored; an unknown action raises
        ``ValueError`` (the control loop counts the message as dropped)."""
        action = header[debug_ops.ACTION]
        self._expire()
        handler = self._relay_actions.get(action)
        if handler is None:
            raise ValueError(f"unknown relay action {action!r}")
        handler(header)

    def _session(self, header: dict) -> IdeSession | None:
        """The open session a relay message is for (now seen alive), or ``None``."""
        session = self.sessions.get(header.get(debug_ops.SESSION))
        if session is not None:
            session.last_seen = time.monotonic()
        return session

    def _relay_open(self, header: dict) -> None:
        self.debugger.arm()
        sid = header.get(debug_ops.SESSION)
        with self._lock:
            self.sessions[sid] = IdeSession(sid, header[debug_ops.TO])

    def _relay_data(self, header: dict) -> None:
        session = self._session(header)
        for message in session.parser.feed(header[debug_ops.DATA]) if session is not None else ():
            if message.get("type") == "request":
                self._request(session, message)

    def _relay_close(self, header: dict) -> None:
        session = self._session(header)
        if session is not None:
            self._drop(session)

    def on_event(self, message: dict) -> None:
        """A debugpy event (reader thread): every configured IDE session gets it."""
        self._expire()
        for session in list(self.sessions.values()):
            if session.configured:
                self._send(session, {**message})

    def breakpoints(self, path: str) -> list[dict]:
        """Every IDE's breakpoints in ``path`` (session order)."""
        return [bp for s in list(self.sessions.values()) for bp in s.breakpoints.get(path, [])]

    # internals ---------------------------------------------------------------------------
    def _send(self, session: IdeSession, message: dict) -> None:
        message["seq"] = session.next_seq()
        frames = wire_frames.encode(self.debugger.server.cluster_id,
                                    {envelope.KIND: debug_ops.RELAY, debug_ops.SESSION: session.sid,
                                     debug_ops.DATA: encode(message)})
        self.debugger.server.outbox.send(session.address, frames)

    def _respond(self, session: IdeSession, request: dict, body: dict | None = None, success: bool = True,
                 message: str | None = None) -> None:
        response = {"type": "response", "request_seq": request["seq"], "command": request["command"],
                    "success": success}
        if body is not None:
            response["body"] = body
        if message is not None:
            response["message"] = message
        self._send(session, response)

    def _event(self, session: IdeSession, event: str, body: dict | None = None) -> None:
        self._send(session, {"type": "event", "event": event, **({"body": body} if body is not None else {})})

    def _request(self, session: IdeSession, request: dict) -> None:
        self._commands.get(request.get("command"), self._forward)(session, request)

    def _initialize(self, session: IdeSession, request: dict) -> None:
        self._respond(session, request, self.debugger.capabilities)

    def _attach(self, session: IdeSession, request: dict) -> None:
        self._respond(session, request, {})
        self._event(session, "initialized")

    def _configuration_done(self, session: IdeSession, request: dict) -> None:
        self._respond(session, request, {})
        session.configured = True
        for tid, stop in list(self.debugger.stops.items()):
            self._event(session, "stopped", {"reason": stop.get("reason") or "breakpoint", "threadId": tid,
                                             "allThreadsStopped": False, "preserveFocusHint": False})

    def _acknowledge(self, session: IdeSession, request: dict) -> None:
        """Exception filters: acknowledged, not applied (post-mortem is the cluster's)."""
        self._respond(session, request, {})

    def _no_function_breakpoints(self, session: IdeSession, request: dict) -> None:
        self._respond(session, request, {"breakpoints": []})

    def _disconnect(self, session: IdeSession, request: dict) -> None:
        self._respond(session, request, {})
        self._drop(session)

    def _forward(self, session: IdeSession, request: dict) -> None:
        command = request["command"]
        tid = (request.get("arguments") or {}).get("threadId")
        resumed = [s["ident"] for t, s in list(self.debugger.stops.items())
                   if command in RESUMING and (t == tid or (command == "continue" and not
                                                            (request.get("arguments") or {}).get("singleThread")))]

        def done(response: dict) -> None:
            self._respond(session, request, response.get("body"), bool(response.get("success")),
                          response.get("message"))
            for ident in resumed:
                pydevd_adapter.wake(ident)

        self.debugger.client.request_async(request["command"], request.get("arguments") or {}, done)

    def _set_breakpoints(self, session: IdeSession, request: dict) -> None:
        args = request.get("arguments") or {}
        path = (args.get("source") or {}).get("path")
        if not path:
            self._respond(session, request, {"breakpoints": []})
            return
        if (args.get("source") or {}).get("monarchText"):  # a notebook cell's text (see notebook.lab_debugger)
            arming.materialize(path, args["source"]["monarchText"])
        mine = list(args.get("breakpoints") or [])
        session.breakpoints[path] = mine
        if not mine:
            session.breakpoints.pop(path)
        offset = len(self.debugger.ours(path))
        for other in list(self.sessions.values()):
            if other is session:
                break
            offset += len(other.breakpoints.get(path, []))
        wanted = self.debugger.ours(path) + self.breakpoints(path)

        def done(response: dict) -> None:
            results = (response.get("body") or {}).get("breakpoints", [])
            self._respond(session, request, {"breakpoints": results[offset:offset + len(mine)]},
                          bool(response.get("success")), response.get("message"))

        self.debugger.client.request_async("setBreakpoints", {"source": {"path": path}, "breakpoints": wanted}, done)

    def _drop(self, session: IdeSession) -> None:
        with self._lock:
            self.sessions.pop(session.sid, None)
        for path in list(session.breakpoints):  # its breakpoints go; the cluster's stay
            if self.debugger.client is not None:
                self.debugger.client.request_async(
                    "setBreakpoints", {"source": {"path": path},
                                       "breakpoints": self.debugger.ours(path) + self.breakpoints(path)},
                    lambda response: None)

    def _expire(self) -> None:
        now = time.monotonic()
        for session in list(self.sessions.values()):
            if now - session.last_seen > SESSION_TIMEOUT_S:
                self._drop(session)
