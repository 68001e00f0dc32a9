"""The host agent's side of proc output: read every proc's stdout and stderr pipes,
cut them into lines and hand over batches of attributed lines.

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

# (time, proc_id, stream, mesh, rank, origin, text, mesh size)
Line = tuple[float, str, str, "str | None", "int | None", "str | None", str, "int | None"]


class Capture:
    """Pipes of the procs of one host agent. ``on_lines`` is called (on the event loop)
    soon after lines arrive, with the batch taken by :meth:`take`."""

    def __init__(self, on_lines: Callable[[], None], batch_delay_s: float = 0.002):
        self._on_lines = on_lines
        self._delay = batch_delay_s
        self._fds: dict[int, tuple[str, str]] = {}  # read fd -> (proc_id, stream)
        self._partial: dict[int, bytes] = {}
        self._batch: list[Line] = []
        self._scheduled = False

    def pipes_for(self, proc_id: str) -> tuple[int, int]:
        """Make the stdout and stderr pipes of a new proc; returns the write ends, which
        the caller passes to the child and then closes."""
        loop = asyncio.get_running_loop()
        ends = []
        for stream in ("stdout", "stderr"):
            read_fd, write_fd = os.pipe()
            try:
                fcntl.fcntl(write_fd, _F_SETPIPE_SZ, PIPE_BYTES)
            except OSError:
                pass  # over /proc/sys/fs/pipe-max-size: keep the default
            os.set_blocking(read_fd, False)
            self._fds[read_fd] = (proc_id, stream)
            loop.add_reader(read_fd, self._read, read_fd, 1)
            ends.append(write_fd)
        return ends[0], ends[1]

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
        if chunks:
            self._cut(fd, b"".join(chunks))
        if eof:
            rest = self._partial.pop(fd, b"")
            if rest:
                self._add(fd, rest)
            self._forget(fd)

    def _cut(self, fd: int, data: bytes) -> None:
        data = self._partial.pop(fd, b"") + data
        *lines, rest = data.split(b"\n")
        for line in lines:
            self._add(fd, line)
        if len(rest) > stdio.MAX_PARTIAL:
            self._add(fd, rest)
        elif rest:
            self._partial[fd] = rest

    def _add(self, fd: int, raw: bytes) -> None:
        proc_id, stream = self._fds[fd]
        mesh, rank, size, origin, text = stdio.parse(raw)
        self._batch.append((time.time(), proc_id, stream, mesh, rank, origin,
                            text.rstrip(b"\r").decode("utf-8", "replace"), size))
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
        self._partial.pop(fd, None)
