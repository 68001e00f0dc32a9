"""The hub's log store: every line of every proc, in an in-memory ring and in a sqlite
database of the cluster directory (``logs/lines.sqlite``), so nothing is lost when no
client is connected and queries work after a kernel restart or a hub recovery.

A record is a tuple laid out as ``protocol.records.LOG_FIELDS``. The database holds one
row per record, keyed by ``seq`` and indexed by time and by mesh and rank, in WAL mode
(a query never waits for the writer, nor the writer for a query). It keeps at most
``max_bytes`` of lines and none older than ``max_age_s``, the oldest going first;
defaults ``MAX_BYTES`` and ``MAX_AGE_S``, or ``max_mb`` and ``max_age_days`` in the
``[logs]`` table of ``$MONARCH_NB_HOME/config.toml``.

The hub's event loop only appends to the ring and hands records to the store's
writer thread: a slow disk never stalls the hub's heartbeats, and a failing one
(``OSError``, ``sqlite3.Error``) degrades the store to the ring alone, said once on
stderr (``hub.log``), with writes retried every ``RETRY_S``. :meth:`LogStore.query`
may run in another thread (the hub runs it in an executor).
"""

from __future__ import annotations

import bisect
import collections
import functools
import os
import queue
import re
import sqlite3
import sys
import threading
import time
from pathlib import Path
from .. import config
from ..private_paths import unsafe_folder

RING_LINES = 200_000
RETRY_S = 2.0  # how often writes are tried again after the disk failed
CHUNK_RECORDS = 5_000  # records per transaction
MAX_BYTES = 1 << 30  # what the database may hold (1 GiB), unless config.toml says otherwise (max_mb, in MiB)
MAX_AGE_S = 7 * 86400.0  # lines older than this (7 days) are dropped
RETENTION_EVERY_S = 5.0  # how often the writer enforces the limits
MAX_RECORDS = 1_000_000  # the most records one query returns (the oldest ones, or the tail)
# A proc's last lines on this stream are kept by proc, so that its death finds its last
# words at once instead of scanning the ring (2.4 ms a death with a full ring):
LAST_WORDS_STREAM = "stderr"
LAST_WORDS = 80  # lines kept per proc
LAST_WORDS_PROCS = 4096  # procs kept so (the ones that wrote last); the others are scanned for
CATCH_UP_S = 10.0  # how long a query waits for the writer to store what the ring let go of
DB_FILE = "lines.sqlite"
KEPT_STOPPED = 16  # stopped clusters whose log stores are kept (the most recently stopped)

# The fields of a record (LOG_FIELDS), then the proc's mesh, so that a query by mesh
# name finds a proc mesh's lines through an index too.
_COLUMNS = "seq, time, host, proc, stream, mesh, rank, origin, text, size"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS lines (seq INTEGER PRIMARY KEY, time REAL NOT NULL, host TEXT, proc TEXT,
                                  stream TEXT, mesh TEXT, rank INTEGER, origin TEXT, text TEXT, size INTEGER,
                                  proc_mesh TEXT);
CREATE INDEX IF NOT EXISTS lines_by_time ON lines(time);
CREATE INDEX IF NOT EXISTS lines_by_mesh ON lines(mesh, rank);
CREATE INDEX IF NOT EXISTS lines_by_proc_mesh ON lines(proc_mesh, rank);
"""


def retention() -> tuple[int, float]:
    """``(max_bytes, max_age_s)``: ``[logs]`` ``max_mb`` and ``max_age_days`` of the
    config file, else ``MAX_BYTES`` and ``MAX_AGE_S``. Raises ``ValueError`` for a
    value that is not a positive number."""
    table = config.table("logs")
    unknown = set(table) - {"max_mb", "max_age_days"}
    if unknown:
        raise ValueError(f"{config.path()}: [logs] has no setting {sorted(unknown)[0]!r}; "
                         "known: max_mb, max_age_days")
    for key in table:
        if isinstance(table[key], bool) or not isinstance(table[key], (int, float)) or table[key] <= 0:
            raise ValueError(f"{config.path()}: [logs] {key} = {table[key]!r}: give a number > 0")
    return (int(table["max_mb"] * 2**20) if "max_mb" in table else MAX_BYTES,
            float(table["max_age_days"]) * 86400.0 if "max_age_days" in table else MAX_AGE_S)


class LogStore:
    """``path``: the cluster directory (``None``: the ring alone). ``max_bytes`` and
    ``max_age_s``: the retention limits (``None``: :func:`retention`'s)."""

    def __init__(self, path: Path | None, ring_lines: int = RING_LINES, max_bytes: int | None = None,
                 max_age_s: float | None = None):
        self.ring: collections.deque = collections.deque(maxlen=ring_lines)
        self.seq = 0
        self._last_words: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()
        self._last_words_dropped = False  # a proc's were dropped: a proc not kept may have some in the ring
        self._db: Path | None = None
        self._writer: _Writer | None = None
        if path is not None:
            folder = path / "logs"
            folder.mkdir(mode=0o700, exist_ok=True)
            self._db = folder / DB_FILE
            if max_bytes is None or max_age_s is None:
                try:
                    configured = retention()
                except ValueError as e:  # the hub runs on with the defaults; hub.log says why
                    _say(f"monarch_nb hub: {e}; the log store keeps its defaults")
                    configured = (MAX_BYTES, MAX_AGE_S)
                max_bytes = configured[0] if max_bytes is None else max_bytes
                max_age_s = configured[1] if max_age_s is None else max_age_s
            self._writer = _Writer(self._db, ring_lines, max_bytes, max_age_s)
            self.seq = self._writer.written_seq  # a recovered hub continues from the last stored line

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
            if stream == LAST_WORDS_STREAM:
                self._keep_last_words(proc, records[-1])
        self.ring.extend(records)
        if self._writer is not None:
            self._writer.put(records)
        return records

    def writing(self) -> dict:
        """The database's state: ``ok`` (False while writes fail), ``error`` (the last
        failure), ``unwritten`` (records waiting for the disk), ``lost`` (records
        dropped for good because the disk failed for longer than the ring holds),
        ``file``, ``lines`` and ``bytes`` stored, ``expired`` (lines the limits
        dropped), and the limits ``max_bytes`` and ``max_age_s``."""
        if self._writer is None:
            return {"ok": True, "error": None, "unwritten": 0, "lost": 0, "file": None}
        return self._writer.state()

    def query(self, mesh: str | None = None, ranks: list[int] | None = None, stream: str | None = None,
              since: float | None = None, grep: str | None = None, tail: int | None = None,
              after_seq: int = 0, limit: int = MAX_RECORDS) -> list[tuple]:
        """Records matching every given filter, oldest first: ``mesh`` (an actor mesh or
        a proc mesh), ``ranks``, ``stream`` (``stdout``/``stderr``), ``since`` (a time,
        seconds since the epoch), ``grep`` (a regular expression searched in the text),
        ``after_seq``; ``tail`` keeps the last N. At most ``limit`` records: the oldest
        that match (ask again with ``after_seq``), or the last ``tail``. Raises
        ``re.error`` for a bad pattern.

        Safe to call from another thread than the one adding lines: it works on a copy
        of the ring (taken atomically), and reads from the database only records older
        than that copy's first, through its indexes (``after_seq``: only newer rows).
        Blocks while the database is read (a ``grep`` reads every row the other
        filters leave), and up to ``CATCH_UP_S`` while the writer stores what the ring
        has let go of."""
        pattern = re.compile(grep) if grep else None
        limit = min(limit, tail) if tail else limit
        wanted = set(ranks) if ranks is not None else None

        def keep(r) -> bool:
            return ((mesh is None or r[5] == mesh or r[3].rpartition("/")[0] == mesh)
                    and (wanted is None or r[6] in wanted)
                    and (stream is None or r[4] == stream)
                    and (since is None or r[1] >= since)
                    and (pattern is None or pattern.search(r[8]) is not None))

        ring = list(self.ring)  # one C call under the GIL: no add() interleaves
        first = ring[0][0] if ring else self.seq + 1
        newer = ring[bisect.bisect_right(ring, after_seq, key=lambda r: r[0]):]  # seq rises along the ring
        found = [r for r in newer if keep(r)]
        if tail and len(found) >= tail:
            return found[-tail:]
        if first > after_seq + 1 and self._writer is not None:
            # A tail needs only the newest rows the ring lacks; otherwise the oldest come first.
            rows = tail - len(found) if tail else limit
            older = self._writer.read(after_seq, first, mesh, ranks, stream, since, grep, rows, tail is not None)
            found = older + found
        return found[-tail:] if tail else found[:limit]

    def _keep_last_words(self, proc: str, record: tuple) -> None:
        kept = self._last_words.get(proc)
        if kept is None:
            kept = self._last_words[proc] = collections.deque(maxlen=LAST_WORDS)
            if len(self._last_words) > LAST_WORDS_PROCS:
                self._last_words.popitem(last=False)
                self._last_words_dropped = True
        else:
            self._last_words.move_to_end(proc)
        kept.append(record)

    def last(self, proc: str, stream: str, n: int, scan: int = 10_000) -> list[tuple]:
        """The last ``n`` records of ``proc`` on ``stream`` (a dying proc's last words),
        oldest first. O(n) for ``LAST_WORDS_STREAM`` and ``n`` up to ``LAST_WORDS`` (kept
        by proc, whatever the ring holds since); else found among the newest ``scan``
        records of the ring."""
        if stream == LAST_WORDS_STREAM and n <= LAST_WORDS:
            kept = self._last_words.get(proc)
            if kept is not None:
                return list(kept)[-n:] if n else []
            if not self._last_words_dropped:
                return []  # it wrote nothing on that stream
        found: list[tuple] = []
        for i, record in enumerate(reversed(self.ring)):
            if i >= scan or len(found) == n:
                break
            if record[3] == proc and record[4] == stream:
                found.append(record)
        return found[::-1]

    def close(self, timeout: float = 5.0) -> None:
        """Write what is pending (waiting at most ``timeout`` seconds) and close the database."""
        if self._writer is not None:
            self._writer.close(timeout)


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def _regexp(pattern: str, text: str | None) -> bool:
    """sqlite's ``text REGEXP pattern``: Python's ``re.search``."""
    return text is not None and _compiled(pattern).search(text) is not None


def _say(notice: str) -> None:
    """Print ``notice`` on stderr (``hub.log``), if it can be written: it is said from
    the writer's error handling, often about the very disk that holds hub.log, and a
    notice that raised there would end the writer."""
    try:
        print(notice, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _connect(db: Path, readonly: bool = False) -> sqlite3.Connection:
    uri = f"file:{db}?mode=ro" if readonly else f"file:{db}"
    conn = sqlite3.connect(uri, uri=True, timeout=CATCH_UP_S, isolation_level=None, check_same_thread=False)
    conn.create_function("regexp", 2, _regexp, deterministic=True)
    return conn


def read_rows(db: Path, after_seq: int, before_seq: int, mesh: str | None, ranks: list[int] | None,
              stream: str | None, since: float | None, grep: str | None, limit: int, newest: bool) -> list[tuple]:
    """Rows of the database ``db`` with ``after_seq < seq < before_seq`` matching the
    filters, oldest first: the first ``limit``, or with ``newest`` the last; ``[]`` when
    it can't be read (a live store's writer says why in hub.log). Opens it read-only."""
    where = ["seq > ?", "seq < ?"]
    params: list[object] = [after_seq, before_seq]
    if mesh is not None:
        where.append("(mesh = ? OR proc_mesh = ?)")
        params += [mesh, mesh]
    if ranks is not None:
        where.append(f"rank IN ({', '.join('?' * len(ranks))})")
        params += list(ranks)
    for column, op, value in (("stream", "=", stream), ("time", ">=", since), ("text", "REGEXP", grep)):
        if value is not None:
            where.append(f"{column} {op} ?")
            params.append(value)
    sql = (f"SELECT {_COLUMNS} FROM lines WHERE {' AND '.join(where)} "
           f"ORDER BY seq {'DESC' if newest else 'ASC'} LIMIT ?")
    try:
        conn = _connect(db, readonly=True)
        try:
            rows = conn.execute(sql, [*params, limit]).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return []
    return rows[::-1] if newest else rows


def keep(db: Path, target: Path) -> None:
    """Keep the closed store ``db`` of a stopped cluster as ``target`` (moved, with its
    WAL files), then forget the oldest kept stores beyond ``KEPT_STOPPED``, older than
    the retention's age or beyond its bytes in total (:func:`retention`). Never raises:
    a store that can't be kept is said on stderr (``hub.log``)."""
    try:
        problem = unsafe_folder(target.parent) if target.parent.exists() else None
        if problem is not None:  # (a folder another user made: what the actors printed would be theirs to read)
            raise PermissionError(f"{problem}; remove {target.parent}")
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        for suffix in ("", "-wal", "-shm"):
            source, kept = Path(f"{db}{suffix}"), Path(f"{target}{suffix}")
            if source.exists():
                os.chmod(source, 0o600)  # (sqlite made it by the umask; its folder was private)
                os.replace(source, kept)
            else:
                kept.unlink(missing_ok=True)  # a kept store's WAL must not meet another's file
        _forget_old(target.parent)
    except OSError as e:
        _say(f"monarch_nb hub: could not keep this stopped cluster's log store at {target}: {e}")


def _forget_old(folder: Path) -> None:
    try:
        max_bytes, max_age_s = retention()
    except ValueError:
        max_bytes, max_age_s = MAX_BYTES, MAX_AGE_S
    stores = sorted(folder.glob("*.sqlite"), key=lambda p: p.stat().st_mtime, reverse=True)
    total, now = 0, time.time()
    for i, store in enumerate(stores):
        total += store.stat().st_size
        if i >= KEPT_STOPPED or now - store.stat().st_mtime > max_age_s or total > max_bytes:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{store}{suffix}").unlink(missing_ok=True)


def read_kept(db: Path, mesh: str | None = None, ranks: list[int] | None = None, stream: str | None = None,
              since: float | None = None, grep: str | None = None, tail: int | None = None,
              after_seq: int = 0) -> list[tuple]:
    """Records of a stopped cluster's kept store ``db`` (see :func:`keep`), filtered as
    :meth:`LogStore.query`; ``[]`` when it can't be read. Raises ``re.error`` for a bad
    pattern."""
    if grep:
        re.compile(grep)
    return read_rows(db, after_seq, 1 << 62, mesh, ranks, stream, since, grep, tail or MAX_RECORDS, tail is not None)


class _Writer:
    """Writes records to the database from its own thread and enforces its limits.

    On ``OSError`` or ``sqlite3.Error`` (a full disk, a removed directory, a read-only
    file system) it warns once on stderr, keeps up to ``limit`` unwritten records (older
    ones are counted as lost) and, every ``RETRY_S``, reopens the database and writes
    them. Any other failure is handled the same way: nothing ends the thread but
    ``close``."""

    def __init__(self, db: Path, limit: int, max_bytes: int, max_age_s: float):
        self.db = db
        self.limit = limit
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._backlog: collections.deque = collections.deque()
        self._conn: sqlite3.Connection | None = None
        self._error: str | None = None
        self._lost = 0
        self._expired = 0
        self._first_seq = 0  # the oldest stored line, for the line count
        self._bytes = 0
        self._retention_at = 0.0
        self._written = threading.Condition()  # state() and read() look at what the thread changes
        self.written_seq = 0
        try:
            self._open()
            self.written_seq, self._first_seq = self._bounds()
        except (OSError, sqlite3.Error) as e:
            self._failed(e)
        self._thread = threading.Thread(target=self._run, name="monarch-nb-logstore", daemon=True)
        self._thread.start()

    def put(self, records: list[tuple]) -> None:
        self._queue.put(records)

    def state(self) -> dict:
        with self._written:
            lines = self.written_seq - self._first_seq + 1 if self._first_seq else 0
            return {"ok": self._error is None, "error": self._error,
                    "unwritten": len(self._backlog) + self._queue.qsize(), "lost": self._lost,
                    "file": str(self.db), "lines": lines, "bytes": self._bytes, "expired": self._expired,
                    "max_bytes": self.max_bytes, "max_age_s": self.max_age_s}

    def close(self, timeout: float) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    # reading (any thread) -------------------------------------------------------------
    def read(self, after_seq: int, before_seq: int, mesh: str | None, ranks: list[int] | None,
             stream: str | None, since: float | None, grep: str | None, limit: int, newest: bool) -> list[tuple]:
        """Rows with ``after_seq < seq < before_seq`` matching the filters, oldest first:
        the first ``limit``, or with ``newest`` the last. Waits up to ``CATCH_UP_S``
        for the writer to have stored every line below ``before_seq``; ``[]`` when the
        database can't be read (the store has degraded to its ring)."""
        with self._written:
            self._written.wait_for(lambda: self.written_seq >= before_seq - 1 or self._error is not None,
                                   CATCH_UP_S)
        return read_rows(self.db, after_seq, before_seq, mesh, ranks, stream, since, grep, limit, newest)

    # the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        retry_at = 0.0
        stop = False
        while not stop:
            waiting = self._error is not None and bool(self._backlog)
            try:
                item = self._queue.get(timeout=max(0.0, retry_at - time.monotonic()) if waiting else None)
            except queue.Empty:
                item = []
            try:
                stop = self._take(item)
                if self._error is None or time.monotonic() >= retry_at:
                    if not self._write():
                        retry_at = time.monotonic() + RETRY_S
            except Exception as e:  # noqa: BLE001 - a dead writer would leave the store "ok" for ever
                self._failed(e)
                retry_at = time.monotonic() + RETRY_S
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass

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
            with self._written:
                for _ in range(excess):
                    self._backlog.popleft()
                self._lost += excess
        return stop

    def _open(self) -> None:
        conn = _connect(self.db)
        try:
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # before the table exists: space is given back
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")  # WAL keeps it consistent; a power cut may lose the last lines
            conn.execute("PRAGMA cache_size = -65536")  # 64 MiB: the indexes' pages stay in memory
            conn.executescript(_SCHEMA)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _bounds(self) -> tuple[int, int]:
        assert self._conn is not None
        last, first = self._conn.execute("SELECT max(seq), min(seq) FROM lines").fetchone()
        return last or 0, first or 0

    def _write(self) -> bool:
        """Write the backlog and enforce the limits; False (after saying so once) when
        the disk fails."""
        try:
            if self._conn is None:
                self._open()
            conn = self._conn
            assert conn is not None
            while self._backlog:
                with self._written:
                    records = [self._backlog.popleft() for _ in range(min(CHUNK_RECORDS, len(self._backlog)))]
                try:
                    conn.execute("BEGIN")
                    conn.executemany(f"INSERT INTO lines ({_COLUMNS}, proc_mesh) "
                                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                     [(*r, r[3].rpartition("/")[0]) for r in records])
                    conn.execute("COMMIT")
                except BaseException:
                    with self._written:
                        self._backlog.extendleft(reversed(records))  # rolled back: written again on retry
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                with self._written:
                    self.written_seq = records[-1][0]
                    self._first_seq = self._first_seq or records[0][0]
                    self._written.notify_all()
            if time.monotonic() >= self._retention_at:
                self._retention_at = time.monotonic() + RETENTION_EVERY_S
                self._enforce_limits(conn)
        except (OSError, sqlite3.Error) as e:
            self._failed(e)
            return False
        if self._error is not None:
            with self._written:
                self._error = None
            _say(f"monarch_nb hub: writing the log store {self.db} again"
                 + (f"; {self._lost} lines were lost meanwhile" if self._lost else ""))
        return True

    def _failed(self, e: BaseException) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None  # reopened on retry: the path may have been fixed meanwhile
        first = self._error is None
        with self._written:  # before anything is said: saying it may fail too (the same full disk)
            self._error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            self._written.notify_all()  # a query waiting for the writer reads what there is
        if first:
            _say(f"monarch_nb hub: could not write the log store {self.db}: {e}; keeping lines in "
                 f"memory only (the newest {self.limit}) and trying again every {RETRY_S:.0f} s")

    def _enforce_limits(self, conn: sqlite3.Connection) -> None:
        """Drop lines older than ``max_age_s``, then the oldest lines until the database
        holds under ``max_bytes`` (down to 90%, so that it is not done at every check)."""
        dropped = conn.execute("DELETE FROM lines WHERE time < ?", (time.time() - self.max_age_s,)).rowcount
        for _ in range(8):  # pages empty out less evenly than rows go: measure again after each cut
            used = self._used_bytes(conn)
            last, first = self._bounds()
            if used <= self.max_bytes or not first:
                break
            cut = first + max(1, int((last - first + 1) * (1 - 0.9 * self.max_bytes / used)))
            dropped += conn.execute("DELETE FROM lines WHERE seq < ?", (cut,)).rowcount
        if dropped:
            conn.execute("PRAGMA incremental_vacuum")
        last, first = self._bounds()
        with self._written:
            self._expired += max(dropped, 0)
            self._first_seq = first
            self._bytes = self._used_bytes(conn)

    @staticmethod
    def _used_bytes(conn: sqlite3.Connection) -> int:
        pages = conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
        return pages * conn.execute("PRAGMA page_size").fetchone()[0]

