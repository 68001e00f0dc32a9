"""Notebook cells by the names IPython gives them (``Cell In[12], line 5``), not by the
file names the kernel compiles them under (``/tmp/ipykernel_PID/HASH.py``, HASH a hash
of the cell's text): in monarch_nb's tracebacks, the paused list and stacks.

A file of this kernel's cells is named as IPython names it. After a kernel restart the
actors still run code of the earlier kernel's cells; one whose text this kernel ran
too has the same HASH, so it is named as that cell; any other is ``Cell of an earlier
kernel``. Files that are no cell keep their path.
"""

from __future__ import annotations

import os
import re

_CELL_FILE = re.compile(r"(?:^|/)ipykernel_\d+/\d+\.py$")
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


class CellNames:
    """Names of the cells of the kernel of ``shell`` (an IPython shell)."""

    def __init__(self, shell):
        self.shell = shell

    def label(self, path: str | None) -> str | None:
        """``Cell In[12]`` for the file ``path`` of a cell, None for any other file."""
        if not path:
            return None
        compiler = getattr(self.shell, "compile", None)
        if compiler is None:
            return None
        known = getattr(compiler, "format_code_name", lambda name: None)(path)
        if known is not None:
            return " ".join(known)
        if not _CELL_FILE.search(path):
            return None
        name = os.path.basename(path)  # the same text: the same hash, whichever kernel ran it
        for other in list(getattr(compiler, "_filename_map", {})):
            if os.path.basename(other) == name and (found := compiler.format_code_name(other)) is not None:
                return " ".join(found)
        return "Cell of an earlier kernel"

    def where(self, path: str | None, line: int | None) -> str:
        """``Cell In[12], line 5``, or ``FILE:LINE`` (the file's base name) for a file that
        is no cell."""
        label = self.label(path)
        if label is not None:
            return f"{label}, line {line}"
        return f"{os.path.basename(path or '?')}:{line}"

    def in_text(self, text: str) -> str:
        """``text`` (a traceback) with every ``File "CELL FILE", line N`` of a cell as
        ``Cell In[12], line N``."""
        def name(match: re.Match) -> str:
            label = self.label(match["file"])
            return match[0] if label is None else f"{label}, line {match['line']}"

        return _FRAME.sub(name, text)
