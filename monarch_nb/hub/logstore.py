"""The hub's log store: every line of every proc, in an in-memory ring and in an
append-only file of the cluster directory (``logs/lines.jsonl``, one JSON array per
line), so nothing is lost when no client is connected and queries work after a
kernel restart.

A record is ``(seq, time, host, proc, stream, mesh, rank, origin, text, size)``:
``seq`` counts from 1 in arrival order; ``mesh``/``rank`` name the actor that printed
(``size``: its mesh's number of actors), or the proc mesh and proc rank for output not
written by an actor (``size`` then ``None``).
"""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

RING_LINES = 200_000
FIELDS = ("seq", "time", "host", "proc", "stream", "mesh", "rank", "origin", "text", "size")


class LogStore:
    def __init__(self, path: Path | None, ring_lines: int = RING_LINES):
        self.ring: collections.deque = collections.deque(maxlen=ring_lines)
        self.seq = 0
        self._file = None
        if path is not None:
            folder = path / "logs"
            folder.mkdir(mode=0o700, exist_ok=True)
            self._path = folder / "lines.jsonl"
            self.seq = _last_seq(self._path)
            self._file = open(self._path, "a", encoding="utf-8")

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
        if self._file is not None:
            self._file.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
            self._file.flush()
        return records

    def query(self, mesh: str | None = None, ranks: list[int] | None = None, stream: str | None = None,
              since: float | None = None, grep: str | None = None, tail: int | None = None,
              after_seq: int = 0) -> list[tuple]:
        """Records matching every given filter, oldest first: ``mesh`` (an actor mesh or
        a proc mesh), ``ranks``, ``stream`` (``stdout``/``stderr``), ``since`` (a time,
        seconds since the epoch), ``grep`` (a regular expression searched in the text),
        ``after_seq``; ``tail`` keeps the last N. Raises ``re.error`` for a bad pattern."""
        pattern = re.compile(grep) if grep else None
        wanted = set(ranks) if ranks is not None else None

        def keep(r) -> bool:
            return ((mesh is None or r[5] == mesh or r[3].rpartition("/")[0] == mesh)
                    and (wanted is None or r[6] in wanted)
                    and (stream is None or r[4] == stream)
                    and (since is None or r[1] >= since)
                    and r[0] > after_seq
                    and (pattern is None or pattern.search(r[8]) is not None))

        found = [r for r in self.ring if keep(r)]
        ring_has_all = not self.ring or self.ring[0][0] <= after_seq + 1 or self._file is None
        if not ring_has_all and not (tail and len(found) >= tail):
            found = [r for r in self._read_file() if keep(r)]  # what the ring let go of is on disk
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

    def _read_file(self) -> list[tuple]:
        self._file.flush()
        with open(self._path, encoding="utf-8") as f:
            return [tuple(json.loads(line)) for line in f if line.strip()]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _last_seq(path: Path) -> int:
    """The last ``seq`` already in the file (a recovered hub continues from it)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 65536))
            last = [line for line in f.read().splitlines() if line.strip()]
        return json.loads(last[-1])[0] if last else 0
    except (OSError, ValueError, IndexError):
        return 0
