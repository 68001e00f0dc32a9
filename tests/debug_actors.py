"""Actors for the debugger tests (importable by procs: found by file and line)."""

from __future__ import annotations

import time

from monarch_nb.actor import Actor, context, endpoint

BREAK_LINE = 18  # the line after breakpoint() in Paused.work: where a rank pauses


class Paused(Actor):
    @endpoint
    def work(self, x: int) -> int:
        rank = context().actor_instance.rank.rank
        y = x * 10 + rank
        breakpoint()
        z = y + 1
        return z

    @endpoint
    def compute(self, x: int) -> int:
        rank = context().actor_instance.rank.rank
        total = x + rank  # COMPUTE_LINE: breakpoints from the client go here
        return total * 2

    @endpoint
    def fail(self, x: int) -> int:
        doomed = x + context().actor_instance.rank.rank
        raise ValueError(f"bad batch {doomed}")

    @endpoint
    def spin(self, n: int) -> int:
        total = 0
        for i in range(n):
            total += i
        return total

    @endpoint
    def traced(self) -> bool:
        """Does a debugger see this thread: a trace function (3.11), or a tool holding
        sys.monitoring's debugger id (3.12+: pydevd sets no trace function there)?"""
        import sys

        monitoring = getattr(sys, "monitoring", None)
        return sys.gettrace() is not None or (
            monitoring is not None and monitoring.get_tool(monitoring.DEBUGGER_ID) is not None)

    @endpoint
    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @endpoint
    def doze(self, seconds: float) -> float:
        breakpoint()
        time.sleep(seconds)  # a `next` from the line above runs this for `seconds`
        return seconds


COMPUTE_LINE = 24


class AsyncPaused(Actor):
    """An async actor: its endpoints run on its event loop, on its own thread."""

    @endpoint
    async def work(self, x: int) -> int:
        import asyncio

        await asyncio.sleep(0)
        y = x * 10 + context().actor_instance.rank.rank
        breakpoint()
        return y + 1
