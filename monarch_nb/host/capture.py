"""The host agent's side of proc output: read every proc's stdout and stderr pipes and
its record channel (see ``proc.stdio``), cut them into lines and hand over batches of
attributed lines.

Attribution comes only from frames of the record channel, a pipe no output written to
fd 1 or 2 can reach; fd 1 and fd 2 are plain text of the proc, never parsed for tags.
One logical line is one line of the batch however long it is: past ``stdio.LINE_CAP``
bytes the rest is dropped and counted in a ``…truncated N bytes`` marker.

Reading is non-blocking and driven by the event loop; :meth:`Capture.drain` reads
whatever the pipes hold right now, so that a flush request covers every line written
before it. When a proc exits, its pipes are read to the end, so its last words are kept.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from typing import Callable

from ..proc import stdio

PIPE_BYTES = 1 << 20  # larger pipes: a proc printing in bursts blocks less often
READ_BYTES = 1 << 16
_F_SETPIPE_SZ = 1031  # Linux
_RECORDS = "records"  # the stream name of a record channel in ``_fds``
_TAGS_CACHED = 4096

# (time, proc_id, stream, mesh, rank, origin, text, mesh size)
Line = tuple[float, str, str, "str | None", "int | None", "str | None", str, "int | None"]


class Capture:
    """Pipes of the procs of one host agent. ``on_lines`` is called (on the event loop)
    soon after lines arrive, with the batch taken by :meth:`take`."""

    def __init__(self, on_lines: Callable[[], None], batch_delay_s: float = 0.002):
        self._on_lines = on_lines
        self._delay = batch_delay_s
        self._fds: dict[int, tuple[str, str]] = {}  # read fd -> (proc_id, stream or _RECORDS)
        self._raw = stdio.LineCutter()  # fd 1 and 2 of each proc, keyed by read fd
        self._frames: dict[int, bytes] = {}  # record channel read fd -> bytes of an unfinished frame
        # Lines of the record channels, keyed by (read fd, writer pid, stream, tag); a
        # little over LINE_CAP so the proc's own truncation marker is kept as it is.
        self._writers = stdio.LineCutter(stdio.LINE_CAP + 128)
        self._tags: dict[bytes, tuple] = {}  # a frame's tag -> (mesh, rank, size, origin)
        self._batch: list[Line] = []
        self._scheduled = False

    def pipes_for(self, proc_id: str) -> tuple[int, int, int]:
        """Make the record channel, stdout and stderr pipes of a new proc; returns their
        write ends ``(stdout, stderr, records)``, which the caller passes to the child
        (``records`` through ``pass_fds`` and ``stdio.RECORD_FD_ENV``) and then closes."""
        loop = asyncio.get_running_loop()
        ends = {}
        # The record channel first: drains and a dead proc's pipes are read in this
        # order, and an actor's lines usually come before the C-level output they cause.
        for stream in (_RECORDS, "stdout", "stderr"):
            read_fd, write_fd = os.pipe()
            try:
                fcntl.fcntl(write_fd, _F_SETPIPE_SZ, PIPE_BYTES)
            except OSError:
                pass  # over /proc/sys/fs/pipe-max-size: keep the default
            os.set_blocking(read_fd, False)
            self._fds[read_fd] = (proc_id, stream)
            loop.add_reader(read_fd, self._read, read_fd, 1)
            ends[stream] = write_fd
        return ends["stdout"], ends["stderr"], ends[_RECORDS]

    def take(self) -> list[Line]:
        batch, self._batch = self._batch, []
        return batch

    def drain(self) -> None:
        """Read what every pipe holds now."""
        for fd in list(self._fds):
            self._read(fd)

    def close(self, proc_id: str) -> None:
        """The proc has exited: read its pipes to the end and stop watching them."""
        for fd, (owner, _) in list(self._fds.items()):
            if owner == proc_id:
                self._read(fd)  # to the end, unless a grandchild still holds the pipe

    def close_all(self) -> None:
        for fd in list(self._fds):
            self._forget(fd)

    def _read(self, fd: int, chunks_at_most: int = PIPE_BYTES // READ_BYTES + 1) -> None:
        """Read what the pipe holds, at most one pipe's worth (everything written before
        this call). When the event loop calls this, it reads one chunk, so that procs
        printing flat out can't starve the agent's other work (heartbeats, requests)."""
        if fd not in self._fds:
            return
        chunks = []
        eof = False
        for _ in range(chunks_at_most):
            try:
                chunk = os.read(fd, READ_BYTES)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not chunk:
                eof = True
                break
            chunks.append(chunk)
        proc_id, stream = self._fds[fd]
        data = b"".join(chunks)
        if stream == _RECORDS and data:
            self._cut_frames(fd, proc_id, data)
        elif data:
            for line in self._raw.feed(fd, data):
                self._add(proc_id, stream, None, line)
        if eof:
            self._last_lines(fd, proc_id)
            rest = self._raw.rest(fd)
            if rest:
                self._add(proc_id, self._fds[fd][1], None, rest)
            self._forget(fd)

    def _cut_frames(self, fd: int, proc_id: str, data: bytes) -> None:
        buf = self._frames.pop(fd, b"") + data if fd in self._frames else data
        at, head = 0, stdio.HEADER.size
        while len(buf) - at >= head:
            stream, pid, tag_len, text_len = stdio.HEADER.unpack_from(buf, at)
            start = at + head + tag_len
            end = start + text_len
            if stream not in stdio.STREAMS or end - at > stdio.FRAME_BYTES:
                self._corrupt(fd, proc_id, buf[at:])
                return
            if end > len(buf):
                break
            tag = buf[at + head:start]
            name = stdio.STREAMS[stream]
            lines = self._writers.feed((fd, pid, name, tag), buf[start:end])
            if lines:
                who = self._who(tag)
                for line in lines:
                    self._add(proc_id, name, who, line)
            at = end
        if at < len(buf):
            self._frames[fd] = buf[at:]

    def _who(self, tag: bytes) -> tuple:
        who = self._tags.get(tag)
        if who is None:
            if len(self._tags) > _TAGS_CACHED:
                self._tags.clear()
            who = self._tags[tag] = stdio.parse_tag(tag)
        return who

    def _last_lines(self, fd: int, proc_id: str) -> None:
        """The record channel ended: keep what its writers had not ended with a newline
        (a proc killed mid-line, a forked child's last words)."""
        self._frames.pop(fd, None)  # a frame cut short: only an incomplete ``write``
        for key in self._writers.keys():
            if key[0] == fd:
                rest = self._writers.rest(key)
                if rest:
                    self._add(proc_id, key[2], self._who(key[3]), rest)

    def _corrupt(self, fd: int, proc_id: str, rest: bytes) -> None:
        """Bytes that are no frame this runtime wrote (only code in the proc writing to
        the channel on purpose can cause it): the rest of the channel is plain stderr
        text of the proc, so nothing is lost and nothing is attributed from it."""
        self._last_lines(fd, proc_id)
        self._add(proc_id, "stderr", None, b"monarch_nb: this proc's record channel held bytes that are "
                                           b"not a record; what follows on it is shown as plain text")
        self._fds[fd] = (proc_id, "stderr")
        for line in self._raw.feed(fd, rest):
            self._add(proc_id, "stderr", None, line)

    def _add(self, proc_id: str, stream: str, who: tuple | None, raw: bytes) -> None:
        mesh, rank, size, origin = who or (None, None, None, None)
        self._batch.append((time.time(), proc_id, stream, mesh, rank, origin,
                            raw.rstrip(b"\r").decode("utf-8", "replace"), size))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_later(self._delay, self._fire)

    def _fire(self) -> None:
        self._scheduled = False
        self._on_lines()

    def _forget(self, fd: int) -> None:
        if self._fds.pop(fd, None) is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)
        self._raw.rest(fd)
        self._frames.pop(fd, None)
        for key in self._writers.keys():
            if key[0] == fd:
                self._writers.rest(key)
