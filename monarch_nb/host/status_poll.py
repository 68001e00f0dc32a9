"""A host agent's view of what its procs are doing: it asks each of them for its
``status`` (busy/paused actors, memory, CPU time, uptime) every ``POLL_S`` seconds, over
loopback, so that the hub learns it from the agent's heartbeat instead of asking every
proc itself for every ``health()`` and every open health display.

It asks only while the hub says someone watches health (``wanted``, on each of the
hub's heartbeats: a subscriber is open, or ``health()`` was asked lately): with nobody
watching, procs are not woken every second for nothing. The asking runs in its own task: a proc slow to answer delays nothing of the
heartbeat, which only reads what was last heard (``take``). A proc that does not answer
within ``STATUS_TIMEOUT_S`` is reported with no status: the hub calls it unresponsive,
as it would had it asked the proc itself. The hub may also ask for some procs' statuses
at once (``ask_statuses``: its ``health()`` found them stale), answered with them
(:meth:`StatusPoll.ask_now`).

Where NVML is at hand (``host.gpu_usage``), each answer gets the GPU memory its proc
uses (``protocol.gpus.GPU_USED_BYTES``), counted by the agent for the pids ``pids()``
gives: procs are not asked to import torch for it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Callable

from ..protocol import envelope, proc_ops
from ..wire.aio import AioEndpoint
from .gpu_usage import NvmlUsage, with_usage

POLL_S = 1.0  # how often each proc is asked
STATUS_TIMEOUT_S = 1.0  # a proc's answer later than this is not waited for
EXIT_CHECK_S = 0.02  # while waiting for answers, how often procs that exited are let go


class StatusPoll:
    """Asks the procs of ``addresses`` (proc id -> control inbox address, kept current by
    the agent) for their status through ``net``; ``pids()`` gives proc id -> pid (for
    NVML's per-process GPU memory; ``None``: not counted)."""

    def __init__(self, net: AioEndpoint, addresses: dict[str, str],
                 pids: Callable[[], dict[str, int]] | None = None, gpu_usage: NvmlUsage | None = None):
        self._net = net
        self._addresses = addresses
        self._pids = pids
        self._gpu_usage = gpu_usage or NvmlUsage()
        # proc id -> (monotonic when answered, status or None (no answer in time), address)
        self._heard: dict[str, tuple[float, dict | None, str]] = {}
        self.asked = 0  # status requests sent so far
        self.unanswered = 0  # of which not answered in time
        self.wanted = False  # set from the hub's heartbeat (agent_ops.WANT_STATUSES)

    async def run(self) -> None:
        """Ask every ``POLL_S`` seconds until cancelled."""
        while True:
            started = time.monotonic()
            if self.wanted:
                try:
                    await self.ask_all()
                except Exception as e:  # noqa: BLE001 - a bug in one round must not end the polls
                    print(f"monarch_nb host agent: a status round failed ({type(e).__name__}: {e})", file=sys.stderr)
            await asyncio.sleep(max(0.0, POLL_S - (time.monotonic() - started)))

    async def ask_all(self) -> None:
        """Ask every proc at once, for the next heartbeat; returns when all answered or
        timed out."""
        heard = await self.ask(list(self._addresses))
        self._heard.update(heard)  # after the wait: a heartbeat may have taken the dict meanwhile

    async def ask_now(self, proc_ids: list[str]) -> dict[str, list]:
        """Ask the procs ``proc_ids`` of this host at once (those that have exited are
        left out); their statuses as :meth:`take` gives them, for the hub that asked."""
        return self._aged(await self.ask(proc_ids))

    async def ask(self, proc_ids: list[str]) -> dict[str, tuple[float, dict | None, str]]:
        """Ask ``proc_ids`` for their status at once: proc id -> ``(monotonic when
        answered, status or None (no answer within ``STATUS_TIMEOUT_S``), the address
        asked)``, for those that have not exited by then."""
        found: dict[str, tuple[float, dict | None, str]] = {}
        targets = [(proc_id, self._addresses[proc_id]) for proc_id in proc_ids if proc_id in self._addresses]
        if not targets:
            return found
        self.asked += len(targets)
        requests = [asyncio.ensure_future(self._net.request(address, {envelope.OP: proc_ops.STATUS},
                                                            timeout=STATUS_TIMEOUT_S)) for _, address in targets]
        pending = set(requests)
        while pending:  # a proc that exits meanwhile is not waited for
            _, pending = await asyncio.wait(pending, timeout=EXIT_CHECK_S)
            for (proc_id, _), request in zip(targets, requests):
                if request in pending and proc_id not in self._addresses:
                    request.cancel()
                    pending.discard(request)
        replies = [asyncio.CancelledError() if r.cancelled() else r.exception() or r.result() for r in requests]
        pid_of = self._pids() if self._pids is not None and self._gpu_usage.available() else {}
        gpu_used = await asyncio.to_thread(self._gpu_usage.used_by, set(pid_of.values())) if pid_of else {}
        now = time.monotonic()
        for (proc_id, address), reply in zip(targets, replies):
            if proc_id not in self._addresses:  # exited meanwhile
                continue
            if isinstance(reply, BaseException):
                self.unanswered += 1
                found[proc_id] = (now, None, address)
            else:
                header = {k: v for k, v in reply.header.items() if k not in (envelope.PORT, envelope.OK)}
                found[proc_id] = (now, with_usage(header, gpu_used.get(pid_of.get(proc_id, -1))), address)
        return found

    def take(self) -> dict[str, list]:
        """What was heard since the last ``take``: proc id -> ``[seconds since it
        answered, status (``None``: no answer within ``STATUS_TIMEOUT_S``), the address
        asked]``; each is given once."""
        heard, self._heard = self._heard, {}
        return self._aged(heard)

    @staticmethod
    def _aged(heard: dict[str, tuple[float, dict | None, str]]) -> dict[str, list]:
        now = time.monotonic()
        return {proc_id: [round(now - at, 3), status, address] for proc_id, (at, status, address) in heard.items()}

    def forget(self, proc_id: str) -> None:
        """``proc_id`` exited: its last status is not reported."""
        self._heard.pop(proc_id, None)
