"""A proc's stdout and stderr: lines written by an actor carry who wrote them.

The host agent reads both file descriptors of every proc (so output from C
extensions, ``faulthandler`` and a dying proc reaches it too). Python-level writes
from an actor's thread are cut into lines here and each line is prefixed with a tag
naming the actor mesh, the rank and the *origin* of the call being handled (which
client, which notebook cell), so the agent can attribute it and the hub can route it
to the cell that caused it. Other output arrives untagged and is attributed to the
proc.

Tagged line: ``MARK mesh \\x01 rank \\x01 size \\x01 origin \\x02 text \\n`` (``size``: how
many actors the mesh has, so a reader knows when every rank has printed a line).
"""

from __future__ import annotations

import io
import os
import sys
import threading

from .actor import _set_current as set_context
from .actor import current_context

MARK = b"\x00mnb\x01"
_SPLIT_TAG = b"\x02"
_SPLIT_FIELD = b"\x01"
MAX_PARTIAL = 1 << 16  # a line longer than this (bytes) is written in pieces

_calls = threading.local()  # the origin of the call an actor thread is handling
_write_lock = threading.Lock()


def set_call_origin(origin: str | None) -> None:
    """Called by the actor loop around each message: output goes to ``origin``."""
    _calls.origin = origin


def call_origin() -> str | None:
    """The origin of the call this thread is handling (``None`` outside calls)."""
    return getattr(_calls, "origin", None)


def _actor_tag() -> bytes | None:
    ctx = current_context()
    if ctx is None:
        return None
    actor = ctx.actor_instance
    size = len(actor.rank.extent) and actor.rank.extent.nelements
    return f"{actor.mesh_name}\x01{actor.rank.rank}\x01{size}\x01{call_origin() or ''}".encode()


class TaggedStream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` of a proc: line-buffered per thread, tagged lines
    from actor threads, written straight to the file descriptor."""

    def __init__(self, fd: int, name: str):
        self._fd = fd
        self._name = name
        self._partial: dict[int, str] = {}  # thread id -> text not yet ended by a newline

    @property
    def encoding(self) -> str:
        return "utf-8"

    @property
    def name(self) -> str:
        return f"<{self._name}>"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fd

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        me = threading.get_ident()
        buffered = self._partial.pop(me, "") + text
        head, newline, tail = buffered.rpartition("\n")
        if newline:
            self._emit(head + "\n")
        if len(tail) > MAX_PARTIAL:
            self._emit(tail + "\n")
        elif tail:
            self._partial[me] = tail
        return len(text)

    def flush(self) -> None:
        """Lines are written as soon as they end; a partial line waits for its newline
        (so progress bars redrawn with ``\\r`` don't become a line per redraw)."""

    def flush_all(self) -> None:
        """Write every thread's partial line (at exit)."""
        for ident in list(self._partial):
            self._emit(self._partial.pop(ident) + "\n")

    def end_line(self) -> None:
        """Write this thread's partial line, as a terminal would show it (the text
        after its last carriage return): an endpoint's call is over."""
        partial = self._partial.pop(threading.get_ident(), "")
        shown = partial.rpartition("\r")[2]
        if shown:
            self._emit(shown + "\n")

    def _emit(self, text: str) -> None:
        data = text.encode("utf-8", "backslashreplace")
        tag = _actor_tag()
        if tag is not None:
            prefix = MARK + tag + _SPLIT_TAG
            data = b"".join(prefix + line + b"\n" for line in data.split(b"\n")[:-1])
        view = memoryview(data)
        with _write_lock:  # whole lines from concurrent threads never interleave
            while view:
                try:
                    written = os.write(self._fd, view)
                except InterruptedError:
                    continue
                except OSError:
                    return  # the agent is gone; nothing to write to
                view = view[written:]


def parse(line: bytes) -> tuple[str | None, int | None, int | None, str | None, bytes]:
    """Split a line read from a proc: ``(mesh, rank, size, origin, text)``; the first
    four are ``None`` for an untagged line."""
    untagged = (None, None, None, None, line)
    if not line.startswith(MARK):
        return untagged
    tag, _, text = line[len(MARK):].partition(_SPLIT_TAG)
    fields = tag.split(_SPLIT_FIELD)
    if len(fields) != 4:
        return untagged
    mesh, rank, size, origin = fields
    try:
        return mesh.decode(errors="replace"), int(rank), int(size), origin.decode(errors="replace") or None, text
    except ValueError:
        return untagged


def install() -> None:
    """Replace ``sys.stdout`` and ``sys.stderr`` of this proc with tagged streams."""
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout = TaggedStream(1, "stdout")
    sys.stderr = TaggedStream(2, "stderr")
    _inherit_actor_context()


def flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, TaggedStream):
            stream.flush_all()


def end_of_call() -> None:
    """What this thread printed without a final newline goes out with its call."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, TaggedStream):
            stream.end_line()


def _inherit_actor_context() -> None:
    """Threads an actor starts print as that actor, for the call that started them."""
    start, bootstrap = threading.Thread.start, threading.Thread._bootstrap_inner

    def tagged_start(self, *args, **kwargs):
        self._monarch_nb_parent = (current_context(), call_origin())
        return start(self, *args, **kwargs)

    def tagged_bootstrap(self):
        ctx, origin = getattr(self, "_monarch_nb_parent", (None, None))
        if ctx is not None:
            set_context(ctx)
            set_call_origin(origin)
        return bootstrap(self)

    threading.Thread.start = tagged_start
    threading.Thread._bootstrap_inner = tagged_bootstrap
