"""How an exception raised in a proc travels to the client.

The exception is pickled on its own, so that when its type can't be pickled or
can't be imported on the client, the client still gets a :class:`RemoteException`
with the type name, message and remote traceback instead of a decoding error.

Code defined in a notebook cell runs in procs without its text (it travels pickled
by value under the cell's file name), so the proc's traceback has no source lines for
it; the client fills them in from its own cells (:func:`with_cell_source`).
"""

from __future__ import annotations

import linecache
import os
import re
import traceback as tb_module

import cloudpickle

from ..errors import RemoteException

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # monarch_nb/


def pack_exception(exc: BaseException, skip_frames: int = 0) -> tuple:
    """``(type_name, message, traceback_text, pickled_exception_or_None)`` for ``exc``.

    ``skip_frames`` drops that many outermost frames (the runtime's own) from the text,
    and so are the runtime's own frames that come next (its call of the endpoint), down
    to the first frame of user code.
    Never raises: an exception whose ``__str__`` or ``__reduce__`` raises is described
    by what can be read of it.
    """
    tb = exc.__traceback__
    for _ in range(skip_frames):
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        tb = tb.tb_next
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        message = str(exc)
    except BaseException as e:  # noqa: BLE001 - user code: its failure is part of the report
        message = f"<str() of the exception raised {type(e).__name__}>"
    try:
        text = "".join(tb_module.format_exception(type(exc), exc, tb))
    except BaseException:  # noqa: BLE001
        text = "".join(tb_module.format_list(tb_module.extract_tb(tb))) + f"{name}: {message}\n"
    try:
        pickled = cloudpickle.dumps(exc.with_traceback(None))
    except BaseException:  # noqa: BLE001 - sent as its type name and message instead
        pickled = None
    return (name, message, text, pickled)


def unpack_exception(packed: tuple) -> tuple[BaseException, str]:
    """The exception object (original type where possible) and traceback text."""
    name, message, text, pickled = packed
    text = with_cell_source(text)
    if pickled is not None:
        try:
            return cloudpickle.loads(pickled), text
        except BaseException:  # noqa: BLE001 - e.g. a __setstate__ raising SystemExit
            pass
    return RemoteException(name, message), text


_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in .*$')


def with_cell_source(text: str) -> str:
    """``text`` (a formatted traceback) with the source line added under each frame
    that has none, where this process knows the file's text: a notebook cell of this
    kernel (IPython keeps cells in ``linecache``), also one run again after a kernel
    restart (same text, so the same file name in a new directory)."""
    lines = text.splitlines(keepends=True)
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        frame = _FRAME.match(line.rstrip("\n"))
        if frame is None or (i + 1 < len(lines) and lines[i + 1].startswith("    ")):
            continue  # not a frame, or its source is there already
        source = _cell_line(frame["file"], int(frame["line"]))
        if source:
            out.append(f"    {source}\n")
    return "".join(out)


def _cell_line(file: str, number: int) -> str:
    # Entries are (size, mtime, lines, path); IPython's cells have no mtime; lazy
    # entries (a loader, not yet read) are 1-tuples.
    entry = linecache.cache.get(file)
    if entry is None or len(entry) != 4:  # the cell under this kernel's name for it
        name = os.path.basename(file)
        entry = next((e for path, e in list(linecache.cache.items())
                      if len(e) == 4 and e[1] is None and os.path.basename(path) == name), None)
    if entry is None or not 0 < number <= len(entry[2]):
        return ""
    return entry[2][number - 1].strip()
