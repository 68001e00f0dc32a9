"""The thread that writes the hub's state to disk (see ``state``), so that the event
loop never waits for a disk: it appends journal lines and replaces snapshots in the
order they were handed over, with one fsync for all that waited meanwhile (a burst of
N changes costs a few writes, not N).
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Callable

from . import state

SNAPSHOT = "snapshot"
JOURNAL = "journal"


class StateWriter:
    """Writes jobs for the state directory ``path``: ``(SNAPSHOT, gen, text)`` replaces
    ``state.json`` (whose journal is then generation ``gen``) and removes older
    journals; ``(JOURNAL, gen, lines)`` appends to journal ``gen``, and is dropped when
    the snapshot of ``gen`` could not be written (the lines would be read against an
    older snapshot). Each job's ``done`` is called, in this thread, once the job is on
    disk (or failed). A failure is said once on stderr; ``needs_snapshot`` then tells
    the registry to start again from a snapshot."""

    def __init__(self, path: Path):
        self._path = path
        self._jobs: deque[tuple[str, int, bytes, Callable[[], None]]] = deque()
        self._wake = threading.Condition()
        self._closing = False
        self._gen: int | None = None  # the generation of the snapshot on disk, written by this writer
        self._fd: int | None = None  # the journal of that generation, open for appending
        self.needs_snapshot = False
        self._failing = False
        self.snapshots = 0  # written, since this writer started (for benches and tests)
        self.syncs = 0  # fsyncs of the journal
        self._thread = threading.Thread(target=self._run, name="monarch_nb state writer", daemon=True)
        self._thread.start()

    def submit(self, kind: str, gen: int, data: bytes, done: Callable[[], None]) -> None:
        """Queue a job; never blocks on the disk."""
        with self._wake:
            self._jobs.append((kind, gen, data, done))
            self._wake.notify()

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, then stop the thread; blocks up to ``timeout`` seconds
        (the disk's time for the last jobs)."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._jobs and not self._closing:
                    self._wake.wait()
                if not self._jobs:
                    break
                jobs = list(self._jobs)
                self._jobs.clear()
            try:
                self._write(jobs)
            except Exception as e:  # never a dead writer: a spawn awaiting its job would wait for ever
                self._failed(e)
                self._gen = None
            for *_, done in jobs:
                done()
        self._close_journal()

    def _write(self, jobs: list[tuple[str, int, bytes, Callable[[], None]]]) -> None:
        pending: list[bytes] = []  # journal lines of self._gen, written with one fsync
        for kind, gen, data, _ in jobs:
            if kind == JOURNAL:
                if gen == self._gen:
                    pending.append(data)
                continue
            self._append(pending)
            pending = []
            self._snapshot(gen, data)
        self._append(pending)

    def _snapshot(self, gen: int, text: bytes) -> None:
        try:
            state.write_snapshot(self._path, text)
        except OSError as e:
            self._failed(e)
            self._gen = None  # journal lines of any generation would now be read against the old snapshot
            return
        self.snapshots += 1
        self._close_journal()
        self._gen = gen
        self.needs_snapshot = False
        if self._failing:
            _say("monarch_nb hub: writing the state file again")
            self._failing = False
        keep = state.journal_name(gen)
        for old in self._path.glob("state.*.journal"):  # replayed into this snapshot already
            if old.name != keep:
                old.unlink(missing_ok=True)

    def _append(self, lines: list[bytes]) -> None:
        if not lines or self._gen is None:
            return
        data = b"".join(lines)
        try:
            if self._fd is None:
                self._fd = os.open(self._path / state.journal_name(self._gen),
                                   os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            written = 0
            while written < len(data):
                written += os.write(self._fd, data[written:])
            os.fsync(self._fd)
        except OSError as e:
            self._failed(e)
            self._gen = None  # a half line may be in it: what comes after goes to a new generation
            return
        self.syncs += 1

    def _close_journal(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _failed(self, error: Exception) -> None:
        self._close_journal()
        self.needs_snapshot = True
        if not self._failing:
            _say(f"monarch_nb hub: could not write the state file ({error}); the cluster runs on, but a hub "
                 "recovered after this one dies may miss the latest changes")
        self._failing = True


def _say(notice: str) -> None:
    try:
        print(notice, file=sys.stderr)
    except (OSError, ValueError):  # hub.log on the same full disk, or closed at exit
        pass
