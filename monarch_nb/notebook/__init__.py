"""The IPython extension: ``%load_ext monarch_nb`` (the ``monarch`` kernel loads it).

It adds the ``%monarch`` magics, shows actor output under the cell that caused it and
a progress bar (ipywidgets) while a call over many ranks takes more than a second.
"""

from __future__ import annotations

import sys

from . import progress
from .cells import CellLogs
from .magics import ExecFailed, MonarchMagics

_installed: dict[int, CellLogs] = {}


def _show_exec_failure(shell, etype, value, tb, tb_offset=None):
    # The per-rank tracebacks are already shown (stderr); the local one would be noise.
    print(f"{etype.__name__}: {value}", file=sys.stderr, flush=True)
    return None


def load_ipython_extension(shell) -> None:
    if id(shell) in _installed:
        return
    shell.register_magics(MonarchMagics)
    shell.set_custom_exc((ExecFailed,), _show_exec_failure)
    cells = _installed[id(shell)] = CellLogs(shell)
    cells.register()
    if getattr(shell, "kernel", None) is not None:  # a notebook frontend: widgets can render
        progress.install()


def unload_ipython_extension(shell) -> None:
    cells = _installed.pop(id(shell), None)
    if cells is not None:
        cells.unregister()
        progress.uninstall()
