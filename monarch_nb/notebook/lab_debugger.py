"""The JupyterLab debugger panel on a remote rank, through the kernel's debug channel.

JupyterLab's debugger sends DAP requests to the kernel (``debug_request`` on the
control channel) and shows the kernel's ``debug_event`` messages. ipykernel answers
them with a debugpy inside the kernel process. ``%monarch debug attach MESH RANK
--jupyterlab`` points that channel at a paused rank instead: the kernel's
``debugger.process_request`` is swapped for a bridge that carries the requests over a
relay (``monarch_nb.debug.relay``: signed messages to the rank's proc, where they join
the proc's debugpy session like any IDE) and publishes the proc's events as the
kernel's. What only makes sense in the kernel process is answered here:

- ``debugInfo``: ipykernel's cell-file naming (hash seed, temp prefix), so cells the
  panel dumps get the file names the procs' code objects carry; breakpoints set through
  the panel; the rank's stopped threads.
- ``dumpCell``: ipykernel writes the cell's file here as usual; ``setBreakpoints`` then
  carries the text along so that the proc writes it too (debugpy wants the file).
- variable explorer requests (``inspectVariables``, ``richInspectVariables``,
  ``copyToGlobals``, ``modules``) answer empty: they read the kernel's own globals.

``disconnect`` (turning the panel's debugger off) restores the kernel's own debugger.
Only one bridge at a time, for the kernel it runs in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os

from ..debug.dap import DapClient

_LOCAL_ONLY = {"inspectVariables": {"variables": []}, "richInspectVariables": {"data": {}, "metadata": {}},
               "copyToGlobals": {}, "modules": {"modules": [], "totalModules": 0}}


class LabBridge:
    """Routes the kernel's debug channel to the paused rank behind ``relay``."""

    def __init__(self, kernel, relay, stop):
        self.kernel = kernel
        self.relay = relay
        self.stop = stop
        self.breakpoints: dict[str, list] = {}
        self.stopped: set[int] = {stop.dap_thread}
        self.client = DapClient.connect("127.0.0.1", relay.port, self._on_event, name="monarch-nb-lab-dap")
        self._original = kernel.debugger.process_request
        kernel.debugger.process_request = self.process_request

    def _on_event(self, message: dict) -> None:
        event, body = message.get("event"), message.get("body") or {}
        if event == "_closed":
            return
        if event == "stopped":
            self.stopped.add(body.get("threadId"))
        elif event == "continued":
            if body.get("allThreadsContinued"):
                self.stopped.clear()
            else:
                self.stopped.discard(body.get("threadId"))
        self.kernel._publish_debug_event(message)

    async def _forward(self, message: dict) -> dict:
        done: concurrent.futures.Future = concurrent.futures.Future()
        self.client.request_async(message["command"], message.get("arguments") or {}, done.set_result)
        response = await asyncio.wrap_future(done)
        return {**response, "request_seq": message["seq"]}

    @staticmethod
    def _response(message: dict, body: dict | None = None) -> dict:
        return {"type": "response", "request_seq": message["seq"], "success": True,
                "command": message["command"], "body": body or {}}

    async def process_request(self, message: dict) -> dict:
        command = message.get("command")
        if command == "debugInfo":
            reply = await self._original(message)  # ipykernel's cell-file naming
            reply["body"].update(isStarted=True, breakpoints=[{"source": k, "breakpoints": v}
                                                              for k, v in self.breakpoints.items()],
                                 stoppedThreads=sorted(self.stopped), richRendering=False, copyToGlobals=False)
            return reply
        if command == "dumpCell":
            return await self.kernel.debugger.dumpCell(message)
        if command in _LOCAL_ONLY:
            return self._response(message, _LOCAL_ONLY[command])
        if command == "setBreakpoints":
            args = dict(message.get("arguments") or {})
            source = dict(args.get("source") or {})
            path = source.get("path")
            if path and os.path.exists(path):
                with open(path) as f:
                    source["monarchText"] = f.read()
                args["source"] = source
            self.breakpoints[path] = args.get("breakpoints", [])
            message = {**message, "arguments": args}
        reply = await self._forward(message)
        if command == "disconnect":
            self.close()
        return reply

    def close(self) -> None:
        """Give the kernel its own debugger back (the rank stays paused)."""
        global _bridge
        self.kernel.debugger.process_request = self._original
        self.client.close()
        self.relay.close()
        if _bridge is self:
            _bridge = None


_bridge: LabBridge | None = None


def attach(kernel, debugger, mesh: str, rank: int) -> LabBridge:
    """Point ``kernel``'s debug channel at the paused ``rank`` of ``mesh`` (replacing an
    earlier bridge). Raises ``RuntimeError`` in a kernel without a debugger."""
    global _bridge
    if getattr(kernel, "debugger", None) is None:
        raise RuntimeError("this kernel has no debugger (ipykernel with debugpy is needed)")
    stop = debugger._one(mesh, rank, "attach")
    relay = debugger.attach(mesh, rank)
    if _bridge is not None:
        _bridge.close()
    _bridge = LabBridge(kernel, relay, stop)
    return _bridge
