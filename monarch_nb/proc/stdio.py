"""A proc's stdout and stderr: lines written by an actor carry who wrote them.

The host agent reads three pipes of every proc: fd 1, fd 2, and a *record channel*, a
pipe it opens for the proc alone and names in ``MONARCH_NB_RECORD_FD``. Python-level
writes (``print``, ``sys.stderr.write``, tracebacks) are cut into lines here and sent
on the record channel as frames that say which stream they belong to and, for lines an
actor wrote, the actor mesh, the rank and the *origin* of the call being handled (which
client, which notebook cell), so the agent can attribute each line and the hub can route
it to the cell that caused it. Everything else reaching fd 1 and fd 2 (C extensions,
``faulthandler``, subprocesses, ``os.write(1, ...)``) is plain text of the proc.

Why a side channel rather than a tag inside the fd 1 stream: fd 1 is shared by code we
don't control, so anything parsed out of it can be forged by printing the right bytes
(``\\x00mnb\\x01...``), and a long line written in pieces loses its tag after the first
piece. Announcing byte offsets of fd 1 on a side pipe would not work either: C code and
subprocesses write to fd 1 without the runtime counting their bytes. A secret inside
the tag would live in this process's memory, where actor code can read it. The record
channel is never fd 1 or 2, is not inherited by the proc's children, and its frames are
length-prefixed, so no content can end a frame early or start one: whatever an actor
prints is its own text. (Code in the proc can still find the fd and write to it on
purpose; what matters is that nothing *printed* can change attribution.)

Frame: ``HEADER (stream, writer pid, tag length, text length) + tag + text``, at most
``PIPE_BUF`` bytes, so one ``write`` puts it in the pipe whole even when forked children
of the proc (a DataLoader's workers) write at the same time. ``stream`` is 1 for stdout
and 2 for stderr; ``tag`` is empty (proc output) or ``mesh \\x01 rank \\x01 size \\x01
origin`` (``size``: how many actors the mesh has, so a reader knows when every rank has
printed a line); ``text`` is the next bytes of that writer's lines, which the agent cuts
at newlines per writer (pid, stream, tag). A logical line is always one line however
long: past ``LINE_CAP`` bytes the rest is dropped and counted by a visible marker
(``…truncated N bytes``), here and for raw fd output in the agent.
"""

from __future__ import annotations

import io
import os
import select
import struct
import sys
import threading

from .actor import _set_current as set_context
from .actor import current_context

RECORD_FD_ENV = "MONARCH_NB_RECORD_FD"
HEADER = struct.Struct("<BIHH")  # stream, writer pid, tag length, text length (bytes)
FRAME_BYTES = select.PIPE_BUF  # a write this size or smaller is atomic
STREAMS = {1: "stdout", 2: "stderr"}
LINE_CAP = 1 << 20  # bytes of one line kept, its truncation marker included
MAX_TAG = 1024  # longer tags (absurd names) lose the end of their origin
_MARKER_ROOM = 64  # bytes LINE_CAP keeps free for the marker
_SPLIT_FIELD = b"\x01"
_SMALL = 4096  # partial lines up to this many bytes are kept as bytes

_calls = threading.local()  # the origin of the call an actor thread is handling
_write_lock = threading.Lock()
_pid = os.getpid()  # the writer named in frames: this process, or a forked child


def set_call_origin(origin: str | None) -> None:
    """Called by the actor loop around each message: output goes to ``origin``."""
    _calls.origin = origin


def call_origin() -> str | None:
    """The origin of the call this thread is handling (``None`` outside calls)."""
    return getattr(_calls, "origin", None)


def _actor_tag() -> bytes:
    ctx = current_context()
    if ctx is None:
        return b""
    actor = ctx.actor_instance
    size = len(actor.rank.extent) and actor.rank.extent.nelements
    return f"{actor.mesh_name}\x01{actor.rank.rank}\x01{size}\x01{call_origin() or ''}".encode()[:MAX_TAG]


def parse_tag(tag: bytes) -> tuple[str | None, int | None, int | None, str | None]:
    """``(mesh, rank, size, origin)`` of a frame's tag; all ``None`` for proc output."""
    fields = tag.split(_SPLIT_FIELD, 3)
    if len(fields) != 4:
        return None, None, None, None
    mesh, rank, size, origin = fields
    try:
        return mesh.decode(errors="replace"), int(rank), int(size), origin.decode(errors="replace") or None
    except ValueError:
        return None, None, None, None


def truncated(kept: bytes, dropped: int) -> bytes:
    """``kept`` with the marker saying ``dropped`` bytes of its line were left out."""
    return kept + f" …truncated {dropped} bytes".encode() if dropped else kept


def _cut_point(data: bytes | bytearray, limit: int) -> int:
    """The largest length <= ``limit`` at which ``data`` ends on a UTF-8 character boundary."""
    end = min(limit, len(data))
    if end < len(data):
        while end > 0 and data[end] & 0xC0 == 0x80:
            end -= 1
    return end


def cap(line: bytes, limit: int = LINE_CAP) -> bytes:
    """``line`` cut to ``limit`` bytes (marker included) when longer."""
    if len(line) <= limit:
        return line
    end = _cut_point(line, limit - _MARKER_ROOM)
    return truncated(line[:end], len(line) - end)


class _Pending:
    """The start of a long line not yet ended by a newline: at most ``limit`` bytes kept,
    the rest counted, so a line of any length costs bounded memory."""

    __slots__ = ("kept", "dropped", "room")

    def __init__(self, limit: int):
        self.kept = bytearray()
        self.dropped = 0
        self.room = limit - _MARKER_ROOM

    def add(self, data: bytes) -> None:
        if self.dropped:
            self.dropped += len(data)
            return
        room = self.room - len(self.kept)
        if len(data) <= room:
            self.kept += data
            return
        end = _cut_point(data, room)
        self.kept += data[:end]
        self.dropped = len(data) - end

    def line(self, shown_after_cr: bool = False) -> bytes:
        kept = bytes(self.kept)
        if shown_after_cr:
            kept = kept.rpartition(b"\r")[2]
        return truncated(kept, self.dropped)


class LineCutter:
    """Cuts byte streams, one per key, into whole lines (without their ``\\n``), each
    capped at ``limit`` bytes. Threads may share one cutter if each feeds only its own
    keys (dict operations are atomic)."""

    def __init__(self, limit: int = LINE_CAP):
        self._partial: dict = {}
        self._limit = limit

    def feed(self, key, data: bytes) -> list[bytes]:
        """The lines ``data`` ends (none if it holds no newline); its tail waits."""
        pending = self._partial.pop(key, None)
        end = data.rfind(b"\n")
        if end < 0:
            self._hold(key, pending, data)
            return []
        lines = data[:end].split(b"\n") if end else [b""]
        if pending is not None:
            if type(pending) is bytes:
                lines[0] = pending + lines[0]
            else:
                pending.add(lines[0])
                lines[0] = pending.line()
        if end + _SMALL > self._limit:
            lines = [cap(line, self._limit) for line in lines]
        if end + 1 < len(data):
            self._hold(key, None, data[end + 1:])
        return lines

    def rest(self, key, shown_after_cr: bool = False) -> bytes | None:
        """The unfinished line of ``key`` (``None`` when there is none), and forget it;
        ``shown_after_cr``: only what a terminal shows, the text after its last ``\\r``."""
        pending = self._partial.pop(key, None)
        if type(pending) is bytes:
            return pending.rpartition(b"\r")[2] if shown_after_cr else pending
        return None if pending is None else pending.line(shown_after_cr)

    def keys(self) -> list:
        return list(self._partial)

    def _hold(self, key, pending, data: bytes) -> None:
        # Short partial lines stay bytes (the usual print: text, then "\n"); longer ones
        # grow in place, so a line written a character at a time costs linear time.
        if pending is None:
            if data:
                self._partial[key] = data if len(data) <= _SMALL else self._long(b"", data)
        elif type(pending) is bytes:
            joined = len(pending) + len(data)
            self._partial[key] = pending + data if joined <= _SMALL else self._long(pending, data)
        else:
            pending.add(data)
            self._partial[key] = pending

    def _long(self, start: bytes, data: bytes) -> _Pending:
        pending = _Pending(self._limit)
        pending.add(start)
        pending.add(data)
        return pending


def frames(stream: int, pid: int, tag: bytes, lines: list[bytes]) -> list[bytes]:
    """Frames carrying ``lines`` (without their newlines), each at most ``FRAME_BYTES``."""
    text = lines[0] + b"\n" if len(lines) == 1 else b"\n".join(lines) + b"\n"
    room = FRAME_BYTES - HEADER.size - len(tag)
    if len(text) <= room:
        return [HEADER.pack(stream, pid, len(tag), len(text)) + tag + text]
    return [HEADER.pack(stream, pid, len(tag), len(piece)) + tag + piece
            for piece in (text[at:at + room] for at in range(0, len(text), room))]


class TaggedStream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` of a proc: line-buffered per thread; whole lines go
    out as frames on the record channel ``records_fd``, attributed to the actor whose
    thread wrote them (or, without a record channel, straight to ``fd``, unattributed)."""

    def __init__(self, fd: int, name: str, records_fd: int | None = None):
        self._fd = fd
        self._name = name
        self._stream = 1 if name == "stdout" else 2
        self._records_fd = records_fd
        self._lines = LineCutter()  # keyed by thread id

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
        lines = self._lines.feed(threading.get_ident(), text.encode("utf-8", "backslashreplace"))
        if lines:
            self._emit(lines)
        return len(text)

    def flush(self) -> None:
        """Lines are written as soon as they end; a partial line waits for its newline
        (so progress bars redrawn with ``\\r`` don't become a line per redraw)."""

    def flush_all(self) -> None:
        """Write every thread's partial line (at exit)."""
        for ident in self._lines.keys():
            line = self._lines.rest(ident)
            if line is not None:
                self._emit([line])

    def end_line(self) -> None:
        """Write this thread's partial line, as a terminal would show it (the text
        after its last carriage return): an endpoint's call is over."""
        shown = self._lines.rest(threading.get_ident(), shown_after_cr=True)
        if shown:
            self._emit([shown])

    def _emit(self, lines: list[bytes]) -> None:
        if self._records_fd is None:
            fd, chunks = self._fd, [b"\n".join(lines) + b"\n"]
        else:
            fd, chunks = self._records_fd, frames(self._stream, _pid, _actor_tag(), lines)
        with _write_lock:  # the lines of concurrent threads never interleave
            _write_chunks(fd, chunks)


def _write_chunks(fd: int, chunks: list[bytes]) -> None:
    """Write ``chunks`` to ``fd`` in order, stopping at the first that can't be written.
    A loop of its own, called under ``_write_lock``: an interrupt aimed at the actor
    thread (``proc.actor_loop``) raised at a loop back-edge inside the ``with`` block
    would leave the lock held on Python 3.12+ (see monarch_nb.wire.interrupts)."""
    for chunk in chunks:
        if not _write_all(fd, chunk):
            return


def _write_all(fd: int, data: bytes) -> bool:
    try:
        written = os.write(fd, data)
    except InterruptedError:
        written = 0
    except OSError:
        return False  # the agent is gone; nothing to write to
    if written == len(data):
        return True
    view = memoryview(data)[written:]  # a signal or a long write: write the rest
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return False  # the agent is gone; nothing to write to
        view = view[written:]
    return True


def install() -> None:
    """Replace ``sys.stdout`` and ``sys.stderr`` of this proc with tagged streams writing
    to the record channel the host agent named in ``MONARCH_NB_RECORD_FD`` (which this
    proc's children neither inherit nor hear of)."""
    sys.stdout.flush()
    sys.stderr.flush()
    records_fd = _record_channel()
    sys.stdout = TaggedStream(1, "stdout", records_fd)
    sys.stderr = TaggedStream(2, "stderr", records_fd)
    _inherit_actor_context()
    os.register_at_fork(after_in_child=_after_fork)


def _after_fork() -> None:
    """A forked child (a DataLoader worker) writes its own lines: not a lock another
    thread of the parent held at the fork, nor the parent's unfinished lines."""
    global _write_lock, _pid
    _write_lock = threading.Lock()
    _pid = os.getpid()
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, TaggedStream):
            stream._lines = LineCutter()


def _record_channel() -> int | None:
    value = os.environ.pop(RECORD_FD_ENV, "")
    if not value.isdigit():
        return None
    fd = int(value)
    try:
        os.set_inheritable(fd, False)
    except OSError:
        return None  # not open: started without an agent's channel
    return fd


def flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, TaggedStream):
            stream.flush_all()


def end_of_call() -> None:
    """What this thread printed without a final newline goes out with its call."""
    for stream in (sys.stdout, sys.stderr):
        # (a call that printed no partial line, the usual case, costs a look at the dict)
        if isinstance(stream, TaggedStream) and stream._lines._partial:
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
