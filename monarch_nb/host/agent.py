"""The host agent: starts procs in parallel, watches them exit, stops them, and stops
everything when the hub is gone for longer than the grace period.

Procs are forked by the host's forkserver, this process's child (``proc_launcher``),
or started as this process's children; either way they die with it
(``PR_SET_PDEATHSIG``, through the forkserver), so a host agent that exits takes its
procs along. What a proc starts ends with the proc
(``descendants``): the agent ends it once the proc has exited, for any reason.

The grace period counts only time this agent was itself running and reading its
inbox: a hub stopped for less than the grace period (SIGSTOP, a suspended laptop)
finds everything still running, and so does a hub after this agent was stalled. Nor
does it count time a hub on this machine spent waiting for a CPU
(``monarch_nb.starvation``): on a starved machine a live hub can go unheard for longer
than an ephemeral cluster's 2 s grace period, and stopping every proc then failed every
call of a healthy cluster.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
import sys
import time
from typing import Awaitable, Callable

from .. import fd_limit
from ..starvation import Watched
from ..proc import cell_files
from ..proc.stdio import RECORD_FD_ENV
from ..protocol import agent_ops, envelope, gpus, hub_ops, router_ops
from ..wire import frames as wire_frames
from ..wire import shm
from ..wire.aio import AioEndpoint
from . import descendants, gpu_inventory
from .capture import Capture
from .proc_launcher import ProcLauncher, ProcProcess
from .router import Router
from .status_poll import StatusPoll

HEARTBEAT_S = 0.5
PROC_READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this many seconds
EXIT_REPORT_TIMEOUT_S = 1.0  # how long a signalled agent waits for the hub to take note
STALL_S = 1.0  # a heartbeat this much later than due: this agent was stopped or blocked
SHM_SWEEP_S = 5.0  # how often segments of this host's dead senders are swept (wire.shm)
MALFORMED_LOGGED = 10  # stderr names the first this many messages no handler could act on
REAP_EVERY = 10  # heartbeats between two reapings of orphans that exited


class HostAgent:
    def __init__(self, cluster_id: str, cluster_dir: str, hub: str, host_id: str, grace_s: float,
                 node: str = "", hub_pid: int | None = None):
        """``hub_pid``: the process of the hub that started this agent, when it runs on
        this machine (its cluster.json says so), until its first ``HUB_ALIVE`` says again."""
        self.net = AioEndpoint(cluster_id)
        self.cluster_id = cluster_id
        self.node = node
        self.cluster_dir = cluster_dir
        self.hub = hub
        self.host_id = host_id
        self.hostname = socket.gethostname()
        self.grace_s = grace_s
        self.hub_seen = time.monotonic()
        self.hub_cpu = Watched()  # the hub's waits for a CPU, when it runs on this machine
        self.hub_cpu.heard(hub_pid)
        # The hub's pid, when its HUB_ALIVE says it runs on this machine. Known from the start:
        # a spawn's load can starve the hub before its first HUB_ALIVE reaches a new agent,
        # which then took it for gone and stopped (16 hosts x 8 procs, 2 loaded cores).
        self._hub_here: int | None = hub_pid
        self._hub_starving = False  # its silence past the grace period is excused now (said once)
        self.procs: dict[str, ProcProcess] = {}
        self.launcher = ProcLauncher(f"host agent {host_id}", cluster_dir)
        self.ready: dict[str, asyncio.Future] = {}
        self.stopping: set[str] = set()
        self.exited: dict[str, int] = {}  # exit codes, told to a hub that adopts this agent
        # Resolved once a proc has exited and what it left behind has ended (``descendants``).
        self.ended: dict[str, asyncio.Future] = {}
        self.capture = Capture(self._send_lines)
        self.done = asyncio.Event()
        self.leaving: asyncio.Future | None = None  # set when a signal from outside stops this agent
        self.hub_told = False  # the hub acknowledged that: it has failed this host's procs
        # Why this agent stops every proc (its hub gone, a signal, its router failed, a
        # shutdown): what the calls pending at its router fail with, not a bare exit code.
        self.ending_why: str | None = None
        self.malformed = 0  # verified messages no handler could act on
        self.cell_files = cell_files.record_path(cluster_dir, host_id)  # what procs wrote for the debugger
        self.addresses: dict[str, str] = {}  # proc id -> its control inbox (PROC_READY), asked for its status
        self.statuses = StatusPoll(self.net, self.addresses,  # folded into the heartbeat (host.status_poll)
                                   lambda: {proc_id: proc.pid for proc_id, proc in self.procs.items()})
        # Relays calls over meshes that span hosts, on a thread of its own (host.router); made by run().
        self.router: Router | None = None
        # op -> handler(header), awaited on the receive loop (see _serve)
        self.ops: dict[str, Callable[[dict], Awaitable[None]]] = {
            agent_ops.HUB_ALIVE: self._hub_alive,
            agent_ops.ADOPT: self._adopt,
            agent_ops.PROC_READY: self._proc_ready,
            agent_ops.SPAWN_PROCS: self._spawn_procs,
            agent_ops.STOP_PROCS: self._stop_procs_op,
            agent_ops.SHUTDOWN: self._shutdown,
            agent_ops.DRAIN_LOGS: self._drain_logs,
            agent_ops.ASK_STATUSES: self._ask_statuses,
        }

    async def run(self) -> None:
        descendants.become_subreaper()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda sig=sig: asyncio.ensure_future(
                self._leave(f"its host agent got {signal.Signals(sig).name}")))
        self._housekeep("preparing the cell files record", lambda: cell_files.prepare(self.cell_files))
        await self.launcher.open()  # (it preloads while the hub hears that this agent is up)
        inventory, _ = await asyncio.get_running_loop().run_in_executor(None, gpu_inventory.discover)
        # A router that fails is this host lost (its calls would wait for replies it can't
        # pass on): the agent leaves, telling the hub why, and supervision fails the calls.
        def router_failed(error: BaseException) -> None:  # (on the router's thread)
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(
                self._leave(f"its router failed ({type(error).__name__}: {error})")))

        self.router = Router(self.cluster_id, self.host_id, self._proc_gone, on_failure=router_failed)
        self.router.start()
        await self.net.send(self.hub, {envelope.OP: hub_ops.AGENT_READY, agent_ops.HOST_ID: self.host_id,
                                       "address": self.net.address, "pid": os.getpid(),
                                       router_ops.ROUTER_ADDRESS: self.router.address,
                                       "hostname": self.hostname, "node": self.node,
                                       gpus.AGENT_GPUS: inventory})
        tasks = [asyncio.ensure_future(self._serve()), asyncio.ensure_future(self._heartbeat()),
                 asyncio.ensure_future(self.statuses.run())]
        await self.done.wait()
        for t in tasks:
            t.cancel()
        await self._stop_procs(list(self.procs))
        await loop.run_in_executor(None, self.router.stop)
        self.capture.drain()
        await self._send_lines_now()
        self.capture.close_all()
        await self.launcher.close()
        shm.remove_all(self.cluster_id)  # this host's procs are gone: no segment has a reader left
        self._housekeep("removing cell files", lambda: cell_files.sweep(self.cell_files))  # procs can't: killed
        self.net.close()

    def _proc_gone(self, proc_id: str) -> str | None:
        """(The router's thread) why proc ``proc_id`` of this host is gone, ``None`` while it runs."""
        if proc_id in self.procs:
            return None
        code, ending = self.exited.get(proc_id), self.ending_why
        return (f"proc {proc_id} on host {self.host_id} exited" + ("" if code is None else f" with code {code}")
                + " while a call to it was pending" + ("" if ending is None else f" ({ending})"))

    async def _leave(self, why: str) -> None:
        """Stopped from outside (a cancelled or timed-out Slurm job, a kill), or its router
        failed: the hub hears ``why`` before any proc exit, so calls on this host's procs
        fail at once with the cause (the job's state) rather than as procs stopped on
        purpose."""
        if self.done.is_set() or self.leaving is not None:
            self.done.set()
            return
        self.ending_why = f"its host agent stopped every proc: {why}"
        self.leaving = asyncio.get_running_loop().create_future()
        try:
            await self.net.request(self.hub, {envelope.OP: hub_ops.AGENT_EXITING, agent_ops.HOST_ID: self.host_id,
                                              "why": why},
                                   timeout=EXIT_REPORT_TIMEOUT_S)
            self.hub_told = True
        except asyncio.TimeoutError:
            pass  # no hub: stop anyway
        finally:
            self.leaving.set_result(None)
        self.done.set()

    async def _heartbeat(self) -> None:
        due = time.monotonic()
        next_sweep = due + SHM_SWEEP_S
        for beat in itertools.count():
            if beat % REAP_EVERY == 0:
                self._housekeep("reaping orphans", lambda: descendants.reap_orphans(self._proc_pids()))
            now = time.monotonic()
            if now > next_sweep:
                next_sweep = now + SHM_SWEEP_S
                self._housekeep("sweeping shared memory", lambda: shm.sweep_dead(self.cluster_id))
            if now - due > STALL_S:  # this agent did not run: the hub was not silent, we were deaf
                self.hub_seen = max(self.hub_seen, now)
            silent = self.net.caught_up() - self.hub_seen
            if silent > self.grace_s:
                counted = self.hub_cpu.counted(silent)
                if counted > self.grace_s:
                    print(f"monarch_nb host agent {self.host_id}: hub silent for {self.grace_s} s; "
                          "stopping every proc", file=sys.stderr)
                    self.ending_why = (f"its host agent stopped every proc: the cluster's hub was silent for "
                                       f"{self.grace_s} s (gone)")
                    self.done.set()
                    return
                if not self._hub_starving:  # a hub on this machine, runnable but not running
                    self._hub_starving = True
                    print(f"monarch_nb host agent {self.host_id}: hub (pid {self.hub_cpu.pid}) silent for "
                          f"{silent:.1f} s, {silent - counted:.1f} s of it waiting for a CPU: this machine is "
                          "starved, the hub is not gone", file=sys.stderr)
            await self.net.send(self.hub, {envelope.OP: hub_ops.AGENT_ALIVE, agent_ops.HOST_ID: self.host_id,
                                           "dropped": wire_frames.dropped(),
                                           hub_ops.AGENT_STATUSES: self.statuses.take()})
            due = time.monotonic() + HEARTBEAT_S
            await asyncio.sleep(HEARTBEAT_S)

    def _housekeep(self, what: str, chore: Callable[[], object]) -> None:
        """Run ``chore``; a failure is printed, never the end of the heartbeat (a host
        whose heartbeat stopped would be declared lost with all its procs)."""
        try:
            chore()
        except Exception as e:  # noqa: BLE001 - housekeeping must not take the heartbeat down
            print(f"monarch_nb host agent {self.host_id}: {what} failed: {type(e).__name__}: {e}", file=sys.stderr)

    async def _serve(self) -> None:
        """The receive loop: a message no handler can act on (an unknown op, a field
        missing) gets an error reply if it asked for one, or is dropped; either way it is
        counted and the loop goes on."""
        while True:
            message = await self.net.recv()
            await self._contained(self._dispatch(message), message.header)
            await asyncio.sleep(0)  # queued messages are received without yielding: let others run

    async def _contained(self, work, header: dict) -> None:
        """Await ``work`` (handling the message ``header``); if it raises, count the
        message as malformed, say so on stderr (the first few) and answer with the
        error if it asked for a reply."""
        try:
            await work
        except Exception as e:
            self.malformed += 1
            wire_frames.count_dropped()
            op = header.get(envelope.OP)
            if self.malformed <= MALFORMED_LOGGED:
                print(f"monarch_nb host agent {self.host_id}: failed on a {op!r} message: {type(e).__name__}: {e}",
                      file=sys.stderr)
            try:
                await self.net.reply(header, ok=False,
                                     error=f"host agent {self.host_id} failed on {op}: {type(e).__name__}: {e}")
            except Exception:
                pass  # no usable reply address: dropped, and counted above

    async def _dispatch(self, message) -> None:
        """Run the handler of ``message``'s op; raises ``ValueError`` for an op with none.
        A reply to a request of ours goes to it; one without an op that nobody waits
        for (it came after its timeout) is ignored."""
        if self.net.deliver_reply(message):
            return
        header = message.header
        op = header.get(envelope.OP)
        if op is None:
            return
        handler = self.ops.get(op)
        if handler is None:
            raise ValueError(f"unknown op {op!r}")
        if op in agent_ops.FROM_HUB:
            self.hub_seen = time.monotonic()
            if op == agent_ops.HUB_ALIVE:
                here = header.get(agent_ops.HUB_HOSTNAME) == self.hostname
                self._hub_here = header.get(agent_ops.HUB_PID) if here else None
            self.hub_cpu.heard(self._hub_here)
            self._hub_starving = False
        await handler(header)

    # the ops ---------------------------------------------------------------------------
    async def _hub_alive(self, header: dict) -> None:
        """Hearing from the hub is the point (see ``_dispatch``); it also says whether
        anyone watches health (procs are asked for their status only then)."""
        self.statuses.wanted = bool(header.get(agent_ops.WANT_STATUSES))
        if self.router is not None:
            self.router.routers_lost(header.get(agent_ops.ROUTERS_LOST) or ())

    async def _ask_statuses(self, header: dict) -> None:
        """The hub needs fresh statuses of some of this host's procs (its ``health()``
        found theirs stale): ask them at once, and answer with what they said. The hub
        then sends one request per host, not one per proc, and the hosts ask their procs
        in parallel. Runs in a task of its own: the receive loop does not wait for procs."""
        asyncio.ensure_future(self._contained(self._answer_statuses(header), header))

    async def _answer_statuses(self, header: dict) -> None:
        proc_ids = [str(p) for p in header.get(agent_ops.PROC_IDS) or []]
        await self.net.reply(header, ok=True, **{hub_ops.AGENT_STATUSES: await self.statuses.ask_now(proc_ids)})

    async def _adopt(self, header: dict) -> None:
        # A restarted hub takes over (perhaps at a new address).
        self.hub = header[agent_ops.HUB]
        await self.net.reply(header, ok=True, procs=sorted(self.procs), exited=self.exited)

    async def _proc_ready(self, header: dict) -> None:
        proc_id = header[agent_ops.PROC_ID]
        future = self.ready.get(proc_id)
        if future is not None and not future.done():
            future.set_result((time.monotonic(), header))  # (when: its status's age in the spawn's reply)
            self.addresses[proc_id] = header["address"]
            await self.net.send(self.hub, {envelope.OP: hub_ops.PROC_UP, agent_ops.PROC_ID: proc_id})  # progress

    async def _spawn_procs(self, header: dict) -> None:
        asyncio.ensure_future(self._contained(self._spawn(header), header))

    async def _stop_procs_op(self, header: dict) -> None:
        asyncio.ensure_future(self._contained(self._stop_and_reply(header), header))

    async def _shutdown(self, header: dict) -> None:
        await self.net.reply(header, ok=True)
        self.ending_why = "the cluster was shut down"
        self.done.set()

    async def _drain_logs(self, header: dict) -> None:
        # Every line written before this request goes to the hub before the reply.
        self.capture.drain()
        await self._send_lines_now()
        await self.net.reply(header, ok=True)

    async def _spawn(self, request: dict) -> None:
        """Start every requested proc at once, then wait for each to report its address.
        Procs that would not fit under this agent's open-file limit are refused at once."""
        proc_ids = request[agent_ops.PROC_IDS]
        problem = fd_limit.spawn_problem(f"host agent {self.host_id}", len(self.procs), len(proc_ids))
        if problem:
            await self.net.reply(request, ok=False, error=problem)
            return
        loop = asyncio.get_running_loop()
        env = {**os.environ, **request.get("env", {})}
        env_by_proc = request.get("env_by_proc") or {}  # e.g. torch's RANK for a restarted proc
        for proc_id in proc_ids:
            self.ready[proc_id] = loop.create_future()
            self.exited.pop(proc_id, None)  # a restart reuses the id of a proc that exited
        try:
            for proc_id in proc_ids:
                out, err, records = self.capture.pipes_for(proc_id)
                try:
                    proc = await self.launcher.start(
                        ["--cluster-dir", self.cluster_dir, "--agent", self.net.address, "--proc-id", proc_id],
                        {**env, **env_by_proc.get(proc_id, {}), RECORD_FD_ENV: str(records),
                         descendants.PROC_ID_ENV: proc_id, cell_files.RECORD_ENV: str(self.cell_files)},
                        request.get("cwd") or None, out, err, records, request.get("python"))
                finally:
                    os.close(out)
                    os.close(err)
                    os.close(records)
                self.procs[proc_id] = proc
                self.ended[proc_id] = loop.create_future()
                asyncio.ensure_future(self._watch(proc_id, proc))
            reports = await asyncio.wait_for(
                asyncio.gather(*(self.ready[p] for p in proc_ids)), PROC_READY_TIMEOUT_S)
        except Exception as e:
            why = self._spawn_failure(e, proc_ids) + fd_limit.near_limit()
            await self._stop_procs(proc_ids)
            await self.net.reply(request, ok=False, error=f"could not start procs on {self.host_id}: {why}")
            return
        finally:
            for p in proc_ids:
                self.ready.pop(p, None)
        now = time.monotonic()
        await self.net.reply(request, ok=True, procs=[
            {agent_ops.PROC_ID: r[agent_ops.PROC_ID], "address": r["address"], "pid": r["pid"],
             agent_ops.HOST_ID: self.host_id}
            for _, r in reports], **{hub_ops.AGENT_STATUSES: {
                r[agent_ops.PROC_ID]: [round(now - at, 3), r[agent_ops.PROC_STATUS], r["address"]]
                for at, r in reports if r.get(agent_ops.PROC_STATUS) is not None}})

    def _spawn_failure(self, error: Exception, proc_ids: list[str]) -> str:
        """What went wrong starting ``proc_ids`` (a timeout's own text is empty)."""
        if isinstance(error, asyncio.TimeoutError):
            late = [p for p in proc_ids if p in self.ready and not self.ready[p].done()]
            return (f"{len(late)} of {len(proc_ids)} procs did not report ready within {PROC_READY_TIMEOUT_S:g} s "
                    f"(first: {late[0] if late else '?'}; their output is in the cluster's logs)")
        return f"{type(error).__name__}: {error}"

    def _proc_pids(self) -> set[int]:
        """Children that are not orphans: procs, and the forkserver (whose exit asyncio reads)."""
        return {proc.pid for proc in self.procs.values()} | self.launcher.pids()

    async def _watch(self, proc_id: str, proc: ProcProcess) -> None:
        code = await proc.wait()
        self.procs.pop(proc_id, None)
        self.addresses.pop(proc_id, None)
        self.statuses.forget(proc_id)
        # The proc's leftovers end meanwhile: the hub hears of the exit without waiting for them.
        ending = asyncio.ensure_future(self._end_descendants(proc_id, proc.pid))
        self.capture.close(proc_id)  # its last words go out before the news of its exit
        await self._send_lines_now()
        future = self.ready.get(proc_id)
        if future is not None and not future.done():
            future.set_exception(RuntimeError(f"proc {proc_id} exited with code {code} before it was ready"))
        expected = proc_id in self.stopping
        self.stopping.discard(proc_id)
        self.exited[proc_id] = code
        router = self.router
        if router is not None:
            # Best effort (shared memory the sweep takes later anyway): what it raises
            # must not keep the hub from hearing of the exit, which the calls wait on.
            self._housekeep("letting go of the exited proc's actors", lambda: router.proc_exited(proc_id))
        try:
            if self.leaving is not None:
                await asyncio.shield(self.leaving)  # a cancelled waiter must not cancel it for the others
                if self.hub_told:
                    return  # the hub failed this host's procs already, naming why
            await self.net.send(self.hub, {envelope.OP: hub_ops.PROC_EXITED, agent_ops.PROC_ID: proc_id,
                                           "pid": proc.pid, "returncode": code, "expected": expected})
        finally:
            await ending

    async def _end_descendants(self, proc_id: str, pgid: int) -> None:
        try:
            await descendants.end(proc_id, pgid, self._proc_pids(), STOP_GRACE_S)
        finally:
            ended = self.ended.pop(proc_id, None)
            if ended is not None and not ended.done():
                ended.set_result(None)

    def _send_lines(self) -> None:
        asyncio.ensure_future(self._send_lines_now())

    async def _send_lines_now(self) -> None:
        lines = self.capture.take()
        if lines:
            await self.net.send(self.hub, {envelope.OP: hub_ops.LOG_LINES, agent_ops.HOST_ID: self.host_id,
                                           "lines": lines})

    async def _stop_procs(self, proc_ids: list[str]) -> None:
        """SIGTERM, then SIGKILL those still alive after ``STOP_GRACE_S``; waits for all,
        and for what they started to end (``descendants``)."""
        procs = [(p, self.procs[p]) for p in proc_ids if p in self.procs]
        ended = [self.ended[p] for p, _ in procs if p in self.ended]
        for proc_id, proc in procs:
            self.stopping.add(proc_id)
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        waits = [asyncio.ensure_future(proc.wait()) for _, proc in procs]
        if not waits:
            return
        _, pending = await asyncio.wait(waits, timeout=STOP_GRACE_S)
        for _, proc in procs:
            if proc.returncode is None:
                proc.kill()
        if pending:
            await asyncio.wait(pending)
        if ended:
            await asyncio.wait(ended)

    async def _stop_and_reply(self, request: dict) -> None:
        await self._stop_procs(request[agent_ops.PROC_IDS])
        await self.net.reply(request, ok=True)
