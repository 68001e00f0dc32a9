"""The notebook layer: the IPython extension (``%load_ext monarch_nb``; the ``monarch``
kernel loads it) and every display of monarch_nb objects.

It adds the ``%monarch`` magics (``magics``; the debugger's in ``debug_magics``, the
JupyterLab debugger panel's bridge in ``lab_debugger``), shows actor output under the
cell that caused it (``cells``), a progress bar (ipywidgets) while a call over many
ranks takes more than a second (``progress``), makes Ctrl-C interrupt the cell's calls on
the cluster too (``interrupts``), and shows the health tree as a live widget
with ``text/html`` and ``text/plain`` fallbacks (``display``, ``health_widget``).

It plugs in only by registering hooks on the client runtime (line sink, bar factory,
failure hook: ``client.runtime.ClientRuntime``), never by assigning other modules'
globals, so the actor API behaves the same in a script and a notebook and this layer
only adds display.

May import: everything below it (``client``, ``allocators``, ``debug``, ``proc``,
``protocol``, ``wire``, ``mesh``, ``errors``, the renderers ``health_view`` and
``render``) plus IPython, ipywidgets and rich; nothing below it imports IPython or
ipywidgets. ipywidgets is imported lazily where a terminal IPython without it must
still work (``display``, ``progress``). Nothing below imports this package; ``kernel`` and the
top-level ``monarch_nb`` (the extension's entry points) sit above it.
"""

from __future__ import annotations

import asyncio
import sys

from . import progress
from .cells import CellLogs
from .interrupts import CellInterrupts
from .magics import ExecFailed, MonarchMagics

_installed: dict[int, CellLogs] = {}


def _custom_exc(interrupts: CellInterrupts):
    def show(shell, etype, value, tb, tb_offset=None):
        if issubclass(etype, KeyboardInterrupt):
            interrupts.show(shell, etype, value, tb, tb_offset)
        elif issubclass(etype, asyncio.CancelledError):  # ipykernel's Ctrl-C of a cell with a top-level await
            interrupts.show(shell, etype, value, tb, tb_offset, cancelled=True)
        else:  # ExecFailed: the per-rank tracebacks are already shown (stderr); the local one would be noise
            print(f"{etype.__name__}: {value}", file=sys.stderr, flush=True)
        return None

    return show


def load_ipython_extension(shell) -> None:
    if id(shell) in _installed:
        return
    interrupts = CellInterrupts()
    shell.register_magics(MonarchMagics(shell, interrupts))
    shell.set_custom_exc((ExecFailed, KeyboardInterrupt, asyncio.CancelledError), _custom_exc(interrupts))
    cells = _installed[id(shell)] = CellLogs(shell)
    cells.register()
    if getattr(shell, "kernel", None) is not None:  # a notebook frontend: widgets can render
        progress.install()
        warning = ipykernel_warning()
        if warning:
            print(warning, file=sys.stderr, flush=True)


def ipykernel_warning(version: str | None = None) -> str:
    """What to say when the kernel's ipykernel (``version``: the installed one) is older
    than 7, the first to give each thread its own output parent: before it, actor lines
    that arrive after their cell ended show under whichever cell runs then. "" if fine."""
    if version is None:
        try:
            from ipykernel import __version__ as version
        except ImportError:
            return ""
    try:
        major = int(str(version).split(".")[0])
    except ValueError:
        return ""
    if major >= 7:
        return ""
    return (f"monarch_nb: this kernel runs ipykernel {version}; monarch_nb needs ipykernel>=7 to show every actor "
            f"line under the cell that caused it (on {version} late lines land under the wrong cell): "
            f"pip install 'ipykernel>=7' and restart the kernel")


def unload_ipython_extension(shell) -> None:
    cells = _installed.pop(id(shell), None)
    if cells is not None:
        cells.unregister()
        progress.uninstall()
