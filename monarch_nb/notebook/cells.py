"""Actor output under the notebook cell that caused it.

Before each cell runs, the cell is named (its execute request's ``msg_id``) so that
calls it makes carry it as their origin. Lines that come back are written to the
kernel's stdout/stderr with *that cell's* parent header (``OutStream.set_thread_parent``),
so the frontend shows them under it, streamed as they arrive, even after the cell
has finished. After a cell that made calls, every line they caused is fetched before
the cell completes (``Cluster.flush_logs``). At most ``MAX_LINES_PER_CELL`` lines are
shown per cell; the rest stay in the hub's store and the cell says how to see them.
"""

from __future__ import annotations

import collections
import itertools
import sys

from ..client import logs
from ..client.runtime import runtime
from ..errors import MeshFailure, MonarchNbError, SupervisionError
from ..protocol.states import FailureKind
from .cell_names import CellNames
from .line_gate import LineGate

MAX_LINES_PER_CELL = 1000
_REMEMBERED_CELLS = 256


class CellLogs:
    """Routes folded actor lines to cells; install with :meth:`register`."""

    def __init__(self, shell):
        self.shell = shell
        self.parents: collections.OrderedDict[str, dict | None] = collections.OrderedDict()
        self.shown: collections.Counter = collections.Counter()
        self.hidden: dict[str, collections.Counter] = {}
        self.current: str | None = None
        self.running = False  # a cell is executing now
        self.queued: list[tuple[str, str]] = []  # (notice, failure.why) that came between cells, for the next one
        self.said: list[str] = []  # failure.why of the notices shown under the running cell
        self.names = CellNames(shell)
        self._anonymous = itertools.count(1)
        self.gate = LineGate()  # actor lines between the cell's own lines, not inside one

    def register(self) -> None:
        self.gate.install(sys.stdout)
        self.gate.install(sys.stderr)
        self.shell.events.register("pre_run_cell", self.pre_run_cell)
        self.shell.events.register("post_run_cell", self.post_run_cell)
        rt = runtime()
        rt.set_line_sink(self.sink)
        rt.set_failure_hook(self.on_failure)
        # The cell's result (Out[n]) is published while the cell runs, before
        # post_run_cell: fetch the lines first so they show above it, in order.
        hook = self.shell.displayhook
        base = type(hook)
        flush = self.flush

        def call(self, result=None):
            if result is not None:
                flush()
            return base.__call__(self, result)

        hook.__class__ = type(f"Flushing{base.__name__}", (base,), {"__call__": call, "_monarch_base": base})
        # IPython's own traceback machinery stays (%debug, %tb, the error message); only
        # what monarch_nb's errors show passes through here first.
        show = self.shell._showtraceback
        self.shell._showtraceback = lambda etype, value, stb: show(etype, value, self.traceback(value, stb))

    def unregister(self) -> None:
        self.shell.events.unregister("pre_run_cell", self.pre_run_cell)
        self.shell.events.unregister("post_run_cell", self.post_run_cell)
        hook = self.shell.displayhook
        hook.__class__ = getattr(hook, "_monarch_base", type(hook))
        self.shell.__dict__.pop("_showtraceback", None)
        rt = runtime()
        rt.set_line_sink(None)
        rt.set_failure_hook(None)
        rt.cell = ""
        self.gate.uninstall()

    def flush(self) -> None:
        """Show every line the calls made so far in this cell caused, from every cluster
        this kernel is a client of (the ``%monarch`` one, and any a cell started itself,
        ``Cluster.start_ephemeral()`` included)."""
        rt = runtime()
        if rt.touched:
            rt.touched = False
            for cluster in list(rt.attached.values()):
                cluster.flush_logs(timeout=5.0)

    def pre_run_cell(self, info=None) -> None:
        kernel = getattr(self.shell, "kernel", None)
        parent = kernel.get_parent("shell") if kernel is not None else None
        tag = parent["header"]["msg_id"] if parent else f"cell{next(self._anonymous)}"
        self.parents[tag] = parent
        while len(self.parents) > _REMEMBERED_CELLS:
            old, _ = self.parents.popitem(last=False)
            self.shown.pop(old, None)
            self.hidden.pop(old, None)
        self.current = tag
        self.running = True
        rt = runtime()
        rt.cell = tag
        rt.touched = False
        queued, self.queued = self.queued, []
        self.said = [why for _, why in queued]
        for text, _ in queued:
            print(text, file=sys.stderr, flush=True)

    def post_run_cell(self, result=None) -> None:
        """Show every line the cell's calls caused before the cell completes."""
        self.flush()
        self.running = False
        self.gate.release()
        hidden = self.hidden.pop(self.current, None)
        if hidden:
            meshes = " ".join(sorted(hidden))
            first = sorted(hidden)[0]  # the lines held back are a mesh's last ones: --tail shows them all
            print(f"[monarch] {sum(hidden.values())} more lines from {meshes} are not shown here (over "
                  f"{MAX_LINES_PER_CELL} per cell); see them with %monarch logs {first} --tail {hidden[first]}",
                  file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()

    def on_failure(self, cluster_id: str, failure: MeshFailure, owner: dict | None) -> None:
        """Failure hook: the next call on the mesh raises it (the default), and the
        notebook shows it now, under the running cell, or at the start of the next,
        once. Not shown when it failed a call of this kernel: that call's ``get()``
        raises it, so the cell (its ``try/except``, or its traceback) deals with it."""
        supervision = runtime().supervision
        supervision.arm(cluster_id, failure, owner)
        if supervision.reached_a_call(cluster_id, failure):
            return
        where = f"{owner['mesh']} rank {owner['rank']} did not handle: " if owner else ""
        text = f"[monarch] unhandled failure: {where}{failure.why}"
        if failure.kind == FailureKind.ENDPOINT_FAILED or owner:
            text += f"\n[monarch] the next call on {owner['mesh'] if owner else failure.meshes[0]} raises it"
        if not self.running:
            self.queued.append((text, failure.why))
            return
        self.said.append(failure.why)
        parent = self.parents.get(self.current)
        set_parent = getattr(sys.stderr, "set_thread_parent", None)
        token = set_parent(parent) if parent is not None and set_parent is not None else None
        try:
            print(text, file=sys.stderr, flush=True)
        finally:
            if token is not None:
                sys.stderr.reset_thread_parent(token)

    def traceback(self, value: BaseException, stb: list[str]) -> list[str]:
        """What the notebook shows for the traceback ``stb`` of ``value``: for monarch_nb's
        errors, cells named as IPython names them (``Cell In[12], line 5``), and a
        failure already shown under this cell (the unhandled failure notice) not said
        again by the ``SupervisionError`` the cell's call raised for it."""
        if not isinstance(value, MonarchNbError):
            return stb
        said = self.said if isinstance(value, SupervisionError) else []
        out = []
        for text in stb:
            for why in filter(None, said):
                text = text.replace(why, "the failure shown above")
            out.append(self.names.in_text(text))
        return out

    def sink(self, lines: list[logs.Folded]) -> None:
        """Called on the log receiver's thread with lines in arrival order."""
        for line in lines:
            tag = line.origin.partition(":")[2] if line.origin else ""
            if tag not in self.parents:
                tag = self.current  # from no cell of ours: the cell running now
            if self.shown[tag] >= MAX_LINES_PER_CELL:
                self.hidden.setdefault(tag, collections.Counter())[line.mesh] += len(line.ranks) or 1
                continue
            self.shown[tag] += 1
            self._write(line, self.parents.get(tag), hold=self.running and tag == self.current)

    def _write(self, line: logs.Folded, parent: dict | None, hold: bool) -> None:
        """Write ``line`` under the cell of ``parent``; ``hold``: that cell is running, so
        the line waits for the cell's own output to end its line (``line_gate``)."""
        stream = sys.stderr if line.stream == "stderr" else sys.stdout
        set_parent = getattr(stream, "set_thread_parent", None)

        def writer(write) -> None:
            if parent is None or set_parent is None:  # not an ipykernel stream (terminal IPython)
                write(f"{line}\n")
                return
            token = set_parent(parent)
            try:
                write(f"{line}\n")
            finally:
                stream.reset_thread_parent(token)

        self.gate.write(stream, writer, hold)
