"""Ctrl-C (Kernel → Interrupt) in a cell that waits on actors.

By default the interrupt also reaches the cluster: every call the cell made that some
actor still runs gets ``KeyboardInterrupt`` there (as ``%monarch interrupt MESH`` does,
but only those actors), so the next call runs at once instead of queueing behind work
nobody waits for. The cell ends with one line naming those calls instead of a
traceback through the client's wait. ``%monarch config interrupt_remote off`` (or
``MONARCH_NB_INTERRUPT_REMOTE=off`` in the kernel's environment) leaves them running;
the line then says so. A Ctrl-C in a cell with no call in flight shows the usual
traceback.
"""

from __future__ import annotations

import os

from ..client import in_flight
from ..client.runtime import runtime

REMOTE_ENV = "MONARCH_NB_INTERRUPT_REMOTE"


class CellInterrupts:
    """What a KeyboardInterrupt in a cell does to the cell's calls in flight."""

    def __init__(self):
        self.remote = os.environ.get(REMOTE_ENV, "on").lower() not in ("off", "0", "false", "no")

    def show(self, shell, etype, value, tb, tb_offset=None, cancelled: bool = False) -> None:
        """The custom exception handler's part for ``KeyboardInterrupt`` (runs in the
        kernel's main thread while the cell is still the current one). ``cancelled``:
        the cell's ``CancelledError``, which is how ipykernel ends a cell with a
        top-level ``await`` on Ctrl-C: an interrupt if it was awaiting calls, shown as
        it is otherwise."""
        rt = runtime()
        calls = rt.in_flight.of_cell(rt.cell)
        rt.in_flight.forget_waited()
        if not calls:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
            return
        if self.remote:
            try:
                text = f"interrupted {', '.join(in_flight.interrupt(calls))} on the cluster"
            except KeyboardInterrupt:  # a second Ctrl-C while the procs confirm: never fail the handler
                text = f"{', '.join(in_flight.describe(calls))} may still run (the interrupt was interrupted)"
        else:
            running = in_flight.describe(calls)
            text = (f"{', '.join(running)} still running on the cluster "
                    "(%monarch config interrupt_remote on: Ctrl-C interrupts them too)")
        # The cell's error says it too: ipykernel's execute_reply takes its evalue from the
        # exception itself (nbclient, and front-ends that show "ename: evalue", read that).
        value.args = (text,)
        shell._showtraceback(KeyboardInterrupt, KeyboardInterrupt(text) if cancelled else value,
                             [f"KeyboardInterrupt: {text}"])
