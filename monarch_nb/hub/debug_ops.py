"""The hub's debug registry: paused ranks, the cluster's breakpoints, post-mortem mode.

Procs register each thread that stops in the debugger (``debug_stopped``: mesh,
rank, host, pid, thread, file:line, function, the endpoint call running, since when)
and unregister it when it runs again (``debug_resumed``). Clients list the stops
(``debug_paused``) and hear of every change (event ``debug_changed`` with the whole
list); they send where/eval/step/continue straight to the proc (its control inbox),
never through here.

Breakpoints set from clients (``debug_set_breakpoint``) and post-mortem mode live
here, so they outlive the client that set them; every live proc gets the whole set
whenever it changes and with each ``spawn_actor``, and arms its debugger only when
one concerns an actor it hosts.

Hygiene: a stop whose proc exited (or was replaced by a respawned one) leaves the
list within ``SWEEP_S``; the registry lives as long as the hub, so after a kernel
restart a client that connects sees the same paused ranks. A recovered hub (the old
one died) asks the re-adopted procs for their stops on the first listing; the
breakpoints and post-mortem setting of the dead hub are not recovered (the procs
keep applying theirs until the next change).
"""

from __future__ import annotations

import asyncio
import secrets
import sys
from dataclasses import dataclass, field
from typing import Callable

from ..protocol import debug as debug_actions
from ..protocol import envelope, events, hub_ops, proc_ops
from ..wire.aio import AioEndpoint
from .announce import Announcer
from .errors import HubError
from .registry import Registry

CONFIG_TIMEOUT_S = 10.0  # how long setting a breakpoint waits for each proc to apply it (arming: ~0.3 s)
SYNC_TIMEOUT_S = 2.0  # how long a recovered hub waits for each proc's list of stops
SWEEP_S = 0.1  # how often stops of dead procs are looked for (only while there are stops or breakpoints)


def _public(bp: dict) -> dict:
    return {k: v for k, v in bp.items() if k not in ("source", hub_ops.BREAKPOINT_FUNCTION)}


@dataclass
class DebugState:
    stops: dict[str, dict] = field(default_factory=dict)  # "proc_id/dap thread" -> stop
    breakpoints: list[dict] = field(default_factory=list)
    post_mortem: bool = False
    next_id: int = 1
    configured: dict[str, tuple[int, int]] = field(default_factory=dict)  # proc id -> (pid, config version)
    version: int = 0
    # The list's version: every change counts one, under this hub's own epoch (a recovered
    # hub counts anew), so that a client keeps the newest of replies and events.
    changes: int = 0
    epoch: str = field(default_factory=lambda: secrets.token_hex(4))
    synced: bool = False  # a recovered hub asked the procs for their stops
    relay_refused: int = 0  # connections clients' IDE relays refused (another user's), as they reported
    sweeper: "asyncio.Task | None" = None

    def config(self) -> dict:
        return {"breakpoints": self.breakpoints, "post_mortem": self.post_mortem}

    def active(self) -> bool:
        return bool(self.stops or self.breakpoints or self.post_mortem)


class DebugRegistry:
    """The debug registry over the procs of ``registry``; clients hear of changes
    through ``announcer``. ``recovered``: this hub took over from a dead one (it asks
    the procs for their stops on the first listing)."""

    def __init__(self, registry: Registry, net: AioEndpoint, announcer: Announcer, recovered: bool):
        self._registry = registry
        self._net = net
        self._announcer = announcer
        self._recovered = recovered
        self.state = DebugState()
        # Called with a proc's id when one of its threads paused or ran on (set by the hub:
        # the health tree's status of that proc is stale now, whatever its age).
        self.on_proc_changed: Callable[[str], None] | None = None

    # from procs ----------------------------------------------------------------------
    async def debug_stopped(self, header, message):
        stop = dict(header["stop"])
        found = self._registry.find_proc(stop["proc_id"])
        if found is None or found[2].exit_code is not None or found[2].pid != stop["pid"]:
            return None  # a proc the registry no longer holds
        mesh, rank, proc = found
        host = self._registry.hosts.get(proc.host_id)
        stop.update(proc_mesh=mesh.name, proc_rank=rank, host_id=proc.host_id,
                    host=host.hostname if host is not None else stop.get("host"))
        self.state.stops[stop["key"]] = stop
        if self.on_proc_changed is not None:
            self.on_proc_changed(proc.proc_id)
        await self._changed()
        self._sweep_start()
        return None

    async def debug_resumed(self, header, message):
        gone = [self.state.stops.pop(k, None) for k in header["keys"]]
        if self.on_proc_changed is not None:
            for stop in filter(None, gone):
                self.on_proc_changed(stop["proc_id"])
        if any(gone):
            await self._changed()
        return None

    # from clients --------------------------------------------------------------------
    async def debug_paused(self, header, message):
        """Every paused thread, ordered by mesh and rank."""
        if self._recovered and not self.state.synced:
            await self._sync()
        if self._sweep_once():
            await self._changed()
        return {"stops": self._list(), **self._seq()}

    async def debug_set_breakpoint(self, header, message):
        """Add a breakpoint at ``file``:``line`` (absolute path as the procs see it),
        for every actor of ``mesh`` (``None``: any code in any proc) or only ``ranks`` of
        it, stopping only where ``condition`` (a Python expression) is true."""
        file, line, mesh, ranks, condition = (header.get(k) for k in ("file", "line", "mesh", "ranks", "condition"))
        if not isinstance(file, str) or not file:
            raise HubError("a breakpoint needs a file", "ValueError")
        if not isinstance(line, int) or line < 1:
            raise HubError(f"line {line!r}: give a line number >= 1", "ValueError")
        if ranks is not None and mesh is None:
            raise HubError("ranks need a mesh: name the actor mesh whose ranks should stop", "ValueError")
        if mesh is not None:
            record = self._registry.find_actor_mesh(mesh)
            if record is None:
                known = ", ".join(sorted(self._registry.actor_meshes)) or "none"
                raise HubError(f"no actor mesh {mesh!r} (actor meshes: {known})", "ValueError")
            size = len(record.proc_ranks)
            bad = [r for r in ranks or [] if not 0 <= r < size]
            if bad:
                raise HubError(f"ranks {bad} are outside {mesh!r}, which has {size} actors (ranks 0-{size - 1})",
                               "ValueError")
        if condition:
            try:
                compile(condition, "<condition>", "eval")
            except SyntaxError as e:
                raise HubError(f"condition {condition!r} is not a Python expression: {e.msg}", "ValueError") from None
        state = self.state
        bp = {"id": state.next_id, "file": file, "line": line, "mesh": mesh,
              "ranks": sorted(set(ranks)) if ranks is not None else None, "condition": condition or None}
        if header.get("source"):  # a notebook cell's text: procs write it under its file name
            bp["source"] = header["source"]
        function = header.get(hub_ops.BREAKPOINT_FUNCTION)
        if function is not None:  # procs bind it by the function (debug.binding.identity)
            fields = {"qualname": str, "code": str, "offset": int, "lines": str}
            if not isinstance(function, dict) or not all(isinstance(function.get(k), t) for k, t in fields.items()):
                raise HubError(f"a breakpoint's function needs {', '.join(fields)}", "ValueError")
            bp[hub_ops.BREAKPOINT_FUNCTION] = {k: function[k] for k in fields}
        state.next_id += 1
        state.breakpoints.append(bp)
        bound = await self._push()
        # Where it bound: one entry per proc whose actors run the code (see debug.binding).
        return {"breakpoint": {**_public(bp), "bound": [{"proc_id": proc_id, "file": file}
                                                       for proc_id, files in sorted(bound.items())
                                                       for bp_id, file in files if bp_id == bp["id"]]}}

    async def debug_breakpoints(self, header, message):
        return {"breakpoints": [_public(b) for b in self.state.breakpoints], "post_mortem": self.state.post_mortem}

    async def debug_clear_breakpoints(self, header, message):
        """Remove the breakpoints ``ids`` (``None``: all); unknown ids are an error."""
        state = self.state
        ids = header.get("ids")
        if ids is None:
            cleared, state.breakpoints = state.breakpoints, []
        else:
            known = {b["id"] for b in state.breakpoints}
            unknown = [i for i in ids if i not in known]
            if unknown:
                raise HubError(f"no breakpoint with id {', '.join(map(str, unknown))} "
                               f"(breakpoints: {', '.join(str(i) for i in sorted(known)) or 'none'})", "ValueError")
            cleared = [b for b in state.breakpoints if b["id"] in ids]
            state.breakpoints = [b for b in state.breakpoints if b["id"] not in ids]
        await self._push()
        return {"cleared": len(cleared)}

    async def debug_post_mortem(self, header, message):
        """Post-mortem on (``on: true``): a rank whose endpoint raises pauses in the
        raising frame before the error goes back to the caller."""
        self.state.post_mortem = bool(header["on"])
        await self._push()
        return {"post_mortem": self.state.post_mortem}

    async def debug_relay_refused(self, header, message):
        """One-way: a client's IDE relay refused a connection of another user (or of an
        owner it could not find): counted (``relay_refused`` in the hub's health) and
        said in hub.log."""
        self.state.relay_refused += 1
        uid = header.get(hub_ops.REFUSED_UID)
        print(f"monarch_nb hub: a debugger relay (127.0.0.1:{header.get(hub_ops.REFUSED_PORT)}) refused a "
              f"connection from {'an unknown owner' if uid is None else f'uid {uid}'}", file=sys.stderr, flush=True)
        return None

    # for spawn -----------------------------------------------------------------------
    def spawn_fields(self) -> dict:
        """Fields for a ``spawn_actor`` request: the cluster's debug configuration,
        when there is any (a proc applies it before the actor starts)."""
        state = self.state
        return {proc_ops.DEBUG_CONFIG: state.config()} if (state.breakpoints or state.post_mortem) else {}

    # internals -----------------------------------------------------------------------
    async def _sync(self) -> None:
        """A recovered hub starts with an empty registry while procs it re-adopted may
        hold paused threads: ask each live proc once (at most ``SYNC_TIMEOUT_S``)."""
        state = self.state
        state.synced = True
        replies = await asyncio.gather(*(
            self._net.request(p.address, {envelope.OP: proc_ops.DEBUG, debug_actions.ACTION: debug_actions.STOPS},
                              timeout=SYNC_TIMEOUT_S)
            for p in self._registry.live_procs()), return_exceptions=True)
        for reply in replies:
            if not isinstance(reply, BaseException):
                for stop in reply.header.get(debug_actions.STOPS, []):
                    await self.debug_stopped({"stop": stop}, None)

    def _list(self) -> list[dict]:
        return sorted(self.state.stops.values(),
                      key=lambda s: (s.get("mesh") or "", s.get("rank") if s.get("rank") is not None else -1,
                                     s["proc_id"], s["dap_thread"]))

    async def _changed(self) -> None:
        self.state.changes += 1
        await self._announcer.announce({envelope.OP: events.DEBUG_CHANGED, "stops": self._list(), **self._seq()})

    def _seq(self) -> dict:
        return {events.SEQ: [self.state.epoch, self.state.changes]}

    async def _push(self) -> dict[str, list]:
        """Send the configuration to every live proc and wait (at most ``CONFIG_TIMEOUT_S``)
        until each has applied it, so that a call made right after a breakpoint was set
        stops there. Returns, per proc id, the ``[breakpoint id, file]`` it bound."""
        state = self.state
        state.version += 1
        procs = list(self._registry.live_procs())
        replies = await asyncio.gather(*(self._configure(p, wait=True) for p in procs), return_exceptions=True)
        self._sweep_start()
        return {p.proc_id: reply.header.get(debug_actions.BOUND) or [] for p, reply in zip(procs, replies)
                if not isinstance(reply, BaseException) and reply is not None}

    async def _configure(self, proc, wait: bool = False):
        """Send the configuration to ``proc``; with ``wait``, return its reply."""
        state = self.state
        state.configured[proc.proc_id] = (proc.pid, state.version)
        request = {envelope.OP: proc_ops.DEBUG, debug_actions.ACTION: debug_actions.CONFIG,
                   debug_actions.CONFIG: state.config()}
        if wait:
            return await self._net.request(proc.address, request, timeout=CONFIG_TIMEOUT_S)
        await self._net.send(proc.address, request)
        return None

    def _sweep_once(self) -> bool:
        """Drop stops of procs that are gone; True if any was dropped."""
        state = self.state
        dead = []
        for key, stop in state.stops.items():
            found = self._registry.find_proc(stop["proc_id"])
            if found is None or found[2].exit_code is not None or found[2].pid != stop["pid"]:
                dead.append(key)
        for key in dead:
            del state.stops[key]
        return bool(dead)

    def _sweep_start(self) -> None:
        state = self.state
        if state.sweeper is None or state.sweeper.done():
            state.sweeper = asyncio.ensure_future(self._sweep())

    async def _sweep(self) -> None:
        state = self.state
        while state.active():
            if self._sweep_once():
                await self._changed()
            if state.breakpoints or state.post_mortem:  # procs that started since (respawned) get the set too
                for mesh in self._registry.proc_meshes.values():
                    for proc in mesh.procs:
                        if proc.exit_code is None and state.configured.get(proc.proc_id) != (proc.pid, state.version):
                            await self._configure(proc)
            await asyncio.sleep(SWEEP_S)
