"""Where a breakpoint set on notebook code binds in a proc.

Code defined in a notebook cell reaches procs pickled by value, keeping the file name
the kernel gave the cell (ipykernel: ``/tmp/ipykernel_PID/HASH.py``, HASH a hash of the
cell's text). After a kernel restart the same cell gets a new directory but the same
name, while the actors still run the code they got from the old kernel: a breakpoint
set from the new kernel must bind to the file their code names. So a breakpoint that
carries a cell's text binds to the file of the actors' code with the same name (the
same cell text), and to nothing when the actors run no such code (the cell changed
since they were spawned).
"""

from __future__ import annotations

import inspect
import os


def code_files(classes) -> set[str]:
    """The files of the code that instances of ``classes`` run: their methods' and the
    functions and classes those methods refer to by global name (one level)."""
    files: set[str] = set()
    for cls in classes:
        for klass in inspect.getmro(cls):
            if klass is object:
                continue
            for value in vars(klass).values():
                function = _function(value)
                if function is None:
                    continue
                files.add(function.__code__.co_filename)
                for name in function.__code__.co_names:
                    target = _function(function.__globals__.get(name))
                    if target is not None:
                        files.add(target.__code__.co_filename)
    return files


def _function(value):
    value = getattr(value, "__func__", value)  # staticmethod, classmethod, bound method
    value = getattr(value, "fget", value)  # property
    return value if inspect.isfunction(value) else None


def bind(file: str, has_source: bool, files: set[str]) -> str | None:
    """The file a breakpoint in ``file`` binds to in a proc whose actors run code of
    ``files`` (see :func:`code_files`), or None when it binds nowhere there.
    ``has_source``: it was set on notebook code (the cell's text came with it)."""
    if not has_source:
        return file if os.path.exists(file) else None
    if file in files:
        return file
    same_cell = sorted(f for f in files if os.path.basename(f) == os.path.basename(file))
    return same_cell[0] if same_cell else None
