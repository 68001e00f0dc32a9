"""What tells one construction of an actor mesh from another under the same name.

Re-running a notebook cell that spawns a named mesh (in this kernel, or in a new one
after a restart) gets the live mesh, with its state: that is what keeps a retained
cluster's work across kernels. A cell re-run after the class was edited, or with other
constructor arguments, got that same live mesh too, running the old code with the old
arguments, with nothing said (Monarch makes a new mesh at every spawn). So each spawn
carries two digests, which the hub compares with the live mesh's: a spawn whose class
code or arguments differ is refused (``ValueError``: ``replace=True``, or another name).

- ``code``: the class's own methods and those of its bases outside monarch_nb, as
  bytecode with the file name and first line left out (a kernel's cell files are named
  by its pid; a method moved down by an edit above it is the same method).
- ``args``: the constructor arguments pickled by the standard library (classes by
  reference, not by value as for the procs, so a restarted kernel's arguments digest as
  before); ``None``, not compared, for arguments it can't pickle or over
  ``ARGS_MAX_BYTES`` (not pickled twice).
"""

from __future__ import annotations

import hashlib
import inspect
import marshal
import pickle
import types
from typing import Any

ARGS_MAX_BYTES = 1 << 20


def spawn_digests(cls: type, args: tuple, kwargs: dict, payload_bytes: int) -> dict[str, str | None]:
    """``{"code": ..., "args": ...}`` (hex digests; ``args`` ``None`` where not known) of
    spawning ``cls(*args, **kwargs)``, whose pickled payload is ``payload_bytes`` long."""
    return {"code": _code_digest(cls), "args": _args_digest(args, kwargs, payload_bytes)}


def _code_digest(cls: type) -> str:
    digest = hashlib.sha256()
    for klass in cls.__mro__:
        if klass is object or klass.__module__.split(".")[0] == "monarch_nb":
            continue
        digest.update(klass.__qualname__.encode())
        for name, value in sorted(vars(klass).items()):
            code = _code_of(value)
            if code is not None:
                digest.update(name.encode())
                digest.update(marshal.dumps(_without_place(code)))
    return digest.hexdigest()


def _code_of(value: Any) -> types.CodeType | None:
    value = getattr(value, "__func__", value)  # staticmethod, classmethod
    value = getattr(value, "fget", value)  # property
    try:
        value = inspect.unwrap(value) if callable(value) else value
    except ValueError:  # a __wrapped__ cycle
        pass
    code = getattr(value, "__code__", None)
    return code if isinstance(code, types.CodeType) else None


def _without_place(code: types.CodeType) -> types.CodeType:
    consts = tuple(_without_place(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename="", co_firstlineno=1, co_consts=consts)


def _args_digest(args: tuple, kwargs: dict, payload_bytes: int) -> str | None:
    if payload_bytes > ARGS_MAX_BYTES:
        return None
    try:
        return hashlib.sha256(pickle.dumps((args, kwargs), protocol=5)).hexdigest()
    except Exception:  # noqa: BLE001 - lambdas, local classes: not compared
        return None
