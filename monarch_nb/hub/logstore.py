"""The hub's log store: every line of every proc, in an in-memory ring and in an
append-only file of the cluster directory (``logs/lines.jsonl``, one JSON array per
line), so nothing is lost when no client is connected and queries work after a
kernel restart.

A record is a tuple laid out as ``protocol.records.LOG_FIELDS``.

The hub's event loop only appends to the ring and hands records to the store's
writer thread: a slow disk never stalls the hub's heartbeats, and a full one
(``OSError``) degrades the store to the ring alone, said once on stderr (``hub.log``),
with writes retried every ``RETRY_S``. :meth:`LogStore.query` may run in another
thread (the hub runs it in an executor: reading the file takes seconds).
"""

from __future__ import annotations

import collections
import json
import os
import queue
import re
import stat
import sys
import threading
import time
from pathlib import Path

RING_LINES = 200_000
RETRY_S = 2.0  # how often writes are tried again after the disk failed
CHUNK_RECORDS = 2_000  # records per write(2)


class LogStore:
    def __init__(self, path: Path | None, ring_lines: int = RING_LINES):
        self.ring: collections.deque = collections.deque(maxlen=ring_lines)
        self.seq = 0
        self._path: Path | None = None
        self._writer: _Writer | None = None
        if path is not None:
            folder = path / "logs"
            folder.mkdir(mode=0o700, exist_ok=True)
            self._path = folder / "lines.jsonl"
            self.seq = _last_seq(self._path)
            self._writer = _Writer(self._path, ring_lines)

    def add(self, host: str, lines: list) -> list[tuple]:
        """Store a batch from host agent ``host``; returns the records."""
        records = []
        for when, proc, stream, mesh, rank, origin, text, size in lines:
            if mesh is None:  # not written by an actor: the proc's mesh and rank
                mesh, _, proc_rank = proc.rpartition("/")
                rank = int(proc_rank) if proc_rank.isdigit() else None
            self.seq += 1
            # Tuples of atoms, not lists: the garbage collector stops tracking them, so a
            # ring of 200,000 records doesn't make every full collection take seconds.
            records.append((self.seq, when, host, proc, stream, mesh, rank, origin, text, size))
        self.ring.extend(records)
        if self._writer is not None:
            self._writer.put(records)
        return records

    def writing(self) -> dict:
        """The file's state: ``ok`` (False while writes fail), ``error`` (the last
        failure), ``unwritten`` (records waiting for the disk), ``lost`` (records
        dropped for good because the disk failed for longer than the ring holds)."""
        if self._writer is None:
            return {"ok": True, "error": None, "unwritten": 0, "lost": 0}
        return self._writer.state()

    def query(self, mesh: str | None = None, ranks: list[int] | None = None, stream: str | None = None,
              since: float | None = None, grep: str | None = None, tail: int | None = None,
              after_seq: int = 0) -> list[tuple]:
        """Records matching every given filter, oldest first: ``mesh`` (an actor mesh or
        a proc mesh), ``ranks``, ``stream`` (``stdout``/``stderr``), ``since`` (a time,
        seconds since the epoch), ``grep`` (a regular expression searched in the text),
        ``after_seq``; ``tail`` keeps the last N. Raises ``re.error`` for a bad pattern.

        Safe to call from another thread than the one adding lines: it works on a
        copy of the ring (taken atomically), and reads from the file only records
        older than that copy's first. Blocks for as long as the file takes to read
        (seconds for millions of lines)."""
        pattern = re.compile(grep) if grep else None
        wanted = set(ranks) if ranks is not None else None

        def keep(r) -> bool:
            return ((mesh is None or r[5] == mesh or r[3].rpartition("/")[0] == mesh)
                    and (wanted is None or r[6] in wanted)
                    and (stream is None or r[4] == stream)
                    and (since is None or r[1] >= since)
                    and r[0] > after_seq
                    and (pattern is None or pattern.search(r[8]) is not None))

        ring = list(self.ring)  # one C call under the GIL: no add() interleaves
        first = ring[0][0] if ring else self.seq + 1
        found = [r for r in ring if keep(r)]
        if first > after_seq + 1 and self._path is not None and not (tail and len(found) >= tail):
            found = self._read_file(first, keep) + found  # what the ring let go of is on disk
        return found[-tail:] if tail else found

    def last(self, proc: str, stream: str, n: int, scan: int = 10_000) -> list[tuple]:
        """The last ``n`` records of ``proc`` on ``stream`` among the newest ``scan``
        of the ring (a dying proc's last words), oldest first."""
        found = []
        for i, record in enumerate(reversed(self.ring)):
            if i >= scan or len(found) == n:
                break
            if record[3] == proc and record[4] == stream:
                found.append(record)
        return found[::-1]

    def _read_file(self, before_seq: int, keep) -> list[tuple]:
        """Records of the file with ``seq`` below ``before_seq`` that ``keep`` accepts.
        Lines the writer has half written (or a failed disk cut short) are skipped."""
        found = []
        try:
            if not stat.S_ISREG(os.stat(self._path).st_mode):
                return []  # not a file we could have written (e.g. a device)
            with open(self._path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    try:
                        record = tuple(json.loads(line))
                        seq = record[0]
                    except (ValueError, IndexError):
                        continue
                    if seq >= before_seq:
                        break
                    if keep(record):
                        found.append(record)
        except OSError:
            pass  # the store degrades to the ring; the writer says why in hub.log
        return found

    def close(self, timeout: float = 5.0) -> None:
        """Write what is pending (waiting at most ``timeout`` seconds) and close the file."""
        if self._writer is not None:
            self._writer.close(timeout)


class _Writer:
    """Appends records to the store's file from its own thread.

    On ``OSError`` (a full disk, a removed directory, a read-only file system) it warns
    once on stderr, keeps up to ``limit`` unwritten records (older ones are counted as
    lost) and, every ``RETRY_S``, reopens the file and writes them."""

    def __init__(self, path: Path, limit: int):
        self.path = path
        self.limit = limit
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._backlog: collections.deque = collections.deque()
        self._chunk = b""  # encoded records being written; a failed write keeps its rest
        self._fd: int | None = None
        self._error: str | None = None
        self._lost = 0
        self._lock = threading.Lock()  # state() reads what the thread changes
        self._thread = threading.Thread(target=self._run, name="monarch-nb-logstore", daemon=True)
        self._thread.start()

    def put(self, records: list[tuple]) -> None:
        self._queue.put(records)

    def state(self) -> dict:
        with self._lock:
            return {"ok": self._error is None, "error": self._error,
                    "unwritten": len(self._backlog) + self._queue.qsize(), "lost": self._lost}

    def close(self, timeout: float) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        retry_at = 0.0
        while True:
            waiting = self._error is not None and bool(self._backlog or self._chunk)
            try:
                item = self._queue.get(timeout=max(0.0, retry_at - time.monotonic()) if waiting else None)
            except queue.Empty:
                item = []
            stop = self._take(item)
            if self._error is None or time.monotonic() >= retry_at:
                if not self._write():
                    retry_at = time.monotonic() + RETRY_S
            if stop:
                if self._fd is not None:
                    os.close(self._fd)
                return

    def _take(self, item) -> bool:
        """Move ``item`` and everything else queued into the backlog; True on close."""
        stop = False
        while True:
            if item is None:
                stop = True
            else:
                self._backlog.extend(item)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
        excess = len(self._backlog) - self.limit
        if excess > 0 and self._error is not None:  # the disk failed: the ring holds these anyway
            with self._lock:
                for _ in range(excess):
                    self._backlog.popleft()
                self._lost += excess
        return stop

    def _write(self) -> bool:
        """Write the backlog; False (after saying so once) when the disk fails."""
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            while self._chunk or self._backlog:
                if not self._chunk:
                    with self._lock:
                        records = [self._backlog.popleft() for _ in range(min(CHUNK_RECORDS, len(self._backlog)))]
                    self._chunk = self._encode(records)
                written = os.write(self._fd, self._chunk)
                self._chunk = self._chunk[written:]
        except OSError as e:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None  # reopened on retry: the path may have been fixed meanwhile
            if self._error is None:
                print(f"monarch_nb hub: could not write the log store {self.path}: {e}; keeping lines in "
                      f"memory only (the newest {self.limit}) and trying again every {RETRY_S:.0f} s",
                      file=sys.stderr, flush=True)
            with self._lock:
                self._error = str(e)
            return False
        if self._error is not None:
            print(f"monarch_nb hub: writing the log store {self.path} again"
                  + (f"; {self._lost} lines were lost meanwhile" if self._lost else ""), file=sys.stderr, flush=True)
            with self._lock:
                self._error = None
        return True


    def _encode(self, records: list[tuple]) -> bytes:
        lines = []
        for r in records:
            try:
                lines.append(json.dumps(r, ensure_ascii=False) + "\n")
            except (TypeError, ValueError):  # not JSON (a bug upstream): this line only is lost
                with self._lock:
                    self._lost += 1
        return "".join(lines).encode("utf-8", "replace")


def _last_seq(path: Path) -> int:
    """The last ``seq`` already in the file (a recovered hub continues from it)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return 0
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):  # the last one may be cut short by a failed write
        try:
            return int(json.loads(line)[0])
        except (ValueError, IndexError, TypeError):
            continue
    return 0
