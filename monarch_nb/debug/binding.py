"""Where a breakpoint set on notebook code binds in a proc.

Code defined in a notebook cell reaches procs pickled by value, keeping the file name
the kernel gave the cell (ipykernel: ``/tmp/ipykernel_PID/HASH.py``, HASH a hash of the
cell's text). After a kernel restart the same cell gets a new directory but the same
name, while the actors still run the code they got from the old kernel: a breakpoint
set from the new kernel must bind to the file their code names. So a breakpoint that
carries a cell's text binds to the file of the actors' code with the same name (the
same cell text), and to nothing when the actors run no such code (the cell changed
since they were spawned).

A breakpoint set on a function (or a line of one) carries the function's identity
(:func:`identity`): its qualified name and a fingerprint of its code, which is the
same wherever the function's text is compiled (line numbers count from the function's
own first line). It binds to the function of the actors' code with the same name and
fingerprint, at the same line of that function, whatever cell (file) it is in now or
was in when the actors were spawned: a class moved into a cell of its own after a
kernel restart is still found.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from types import CodeType


def code_files(classes) -> set[str]:
    """The files of the code that instances of ``classes`` run: their methods' and the
    functions and classes those methods refer to by global name (one level)."""
    return {code.co_filename for code in _codes(classes)}


def _codes(classes):
    """The code objects of the functions of :func:`code_files`."""
    for function in _functions(classes):
        yield function.__code__


def _functions(classes):
    """The functions of :func:`code_files`."""
    for cls in classes:
        for klass in inspect.getmro(cls):
            if klass is object:
                continue
            for value in vars(klass).values():
                function = _function(value)
                if function is None:
                    continue
                yield function
                for name in function.__code__.co_names:
                    target = _function(function.__globals__.get(name))
                    if target is not None:
                        yield target


def fingerprint(code: CodeType) -> str:
    """A hash of what ``code`` does and of its lines relative to its first line, but not
    of its file or first line: the same function text compiled in another cell (at
    another line) has the same fingerprint; a changed one has not."""
    digest = hashlib.sha256()

    def add(value) -> None:
        if isinstance(value, CodeType):
            for part in (value.co_code, value.co_names, value.co_varnames, value.co_freevars, value.co_cellvars,
                         value.co_argcount, value.co_posonlyargcount, value.co_kwonlyargcount, value.co_flags,
                         value.co_name, value.co_linetable, getattr(value, "co_exceptiontable", b"")):
                digest.update(repr(part).encode() + b"\0")
            for const in value.co_consts:
                add(const)
        elif isinstance(value, (tuple, list)):
            digest.update(b"(")
            for item in value:
                add(item)
            digest.update(b")")
        elif isinstance(value, frozenset):  # its order is the hash seed's, which differs between processes
            digest.update(repr(sorted(repr(item) for item in value)).encode())
        else:
            digest.update(repr(value).encode() + b"\0")

    add(code)
    return digest.hexdigest()


def identity(function, line: int) -> dict:
    """What a breakpoint at ``line`` (of its file) in ``function`` carries to bind in
    procs whose actors run that function from another file: ``qualname``, ``code``
    (:func:`fingerprint`), ``offset`` (``line`` less the function's first line) and
    ``lines``, the function's text (procs write it where their copy of the function is,
    for debugpy and tracebacks). Raises ``OSError`` when its text can't be found."""
    code = function.__code__
    lines, _ = inspect.getsourcelines(code)
    return {"qualname": function.__qualname__, "code": fingerprint(code), "offset": line - code.co_firstlineno,
            "lines": "".join(lines)}


def bind_function(function: dict, classes) -> tuple[str, int, str] | None:
    """Where the breakpoint on ``function`` (:func:`identity`) binds in the code that
    instances of ``classes`` run: ``(file, line, text)`` of their function with the same
    name and code (``text``: the file's text as far as known: the function's lines at
    their place), or None when they run no such function."""
    for candidate in _functions(classes):
        code = candidate.__code__
        if candidate.__qualname__ == function["qualname"] and fingerprint(code) == function["code"]:
            text = "\n" * (code.co_firstlineno - 1) + function["lines"]
            return code.co_filename, code.co_firstlineno + function["offset"], text
    return None


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
