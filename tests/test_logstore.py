"""The hub's log store on its own (no cluster): a database that outlives the hub, with
limits by size and age, grep in the database, and follow queries that read what's new."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import sqlite3
import sys
import threading
import time

import pytest

from monarch_nb.client.cluster import Cluster
from monarch_nb.hub import logstore
from monarch_nb.hub.logstore import LogStore

from conftest import wait_until

NOW = time.time()
# close() waits for the writer up to this long: a loaded machine (CI) may take more than
# its default 5 s to write 50,000 lines.
CLOSE_S = 120.0


def lines(n: int, start: int = 0, when: float = NOW, mesh: str = "m") -> list[tuple]:
    """``n`` host-agent lines of procs ``mesh/0..3``, as ``LogStore.add`` takes them."""
    return [(when, f"{mesh}/{i % 4}", "stdout", None, None, None, f"line {start + i}", 8) for i in range(n)]


def test_a_reopened_store_continues_and_finds_every_line(tmp_path):
    store = LogStore(tmp_path, ring_lines=100)
    store.add("host0", lines(5_000))
    store.close(CLOSE_S)
    again = LogStore(tmp_path, ring_lines=100)  # a recovered hub: an empty ring
    assert again.seq == 5_000
    assert [r[8] for r in again.query(tail=3)] == ["line 4997", "line 4998", "line 4999"]
    assert len(again.query(mesh="m", ranks=[1])) == 1_250
    again.add("host0", lines(1, start=5_000))
    assert again.query(tail=1)[0][:1] == (5_001,)
    again.close(CLOSE_S)


def test_grep_runs_in_the_database_and_a_bad_pattern_is_an_error(tmp_path):
    store = LogStore(tmp_path, ring_lines=10)
    store.add("host0", lines(1_000))
    store.close(CLOSE_S)
    store = LogStore(tmp_path, ring_lines=10)
    assert [r[8] for r in store.query(grep=r"^line 9\d\d$", ranks=[0], tail=2)] == ["line 992", "line 996"]
    with pytest.raises(re.error):
        store.query(grep="line (")
    store.close(CLOSE_S)


def test_follow_queries_return_only_what_is_new_past_the_ring(tmp_path):
    store = LogStore(tmp_path, ring_lines=10)
    store.add("host0", lines(1_000))
    assert [r[0] for r in store.query(after_seq=985)] == list(range(986, 1_001))  # database, then ring
    assert store.query(after_seq=1_000) == []
    store.add("host0", lines(2, start=1_000))
    assert [r[0] for r in store.query(after_seq=1_000)] == [1_001, 1_002]
    store.close(CLOSE_S)


def test_lines_older_than_the_age_limit_are_dropped(tmp_path):
    store = LogStore(tmp_path, ring_lines=10, max_age_s=3600)
    store.add("host0", lines(100, when=NOW - 7200) + lines(100, start=100))  # one batch: one write
    store.close(CLOSE_S)
    store = LogStore(tmp_path, ring_lines=10, max_age_s=3600)
    kept = store.query()
    assert [r[8] for r in kept] == [f"line {i}" for i in range(100, 200)]
    store.close(CLOSE_S)


def test_the_oldest_lines_go_when_the_store_passes_its_size(tmp_path):
    limit = 512 * 1024
    store = LogStore(tmp_path, ring_lines=10, max_bytes=limit)
    store.add("host0", lines(50_000))
    store.close(CLOSE_S)
    state = store.writing()
    assert state["bytes"] <= limit and state["expired"] > 0
    store = LogStore(tmp_path, ring_lines=10, max_bytes=limit)
    kept = [r[0] for r in store.query()]
    assert kept == list(range(50_001 - len(kept), 50_001))  # the newest, none missing
    store.close(CLOSE_S)


def test_the_limits_come_from_config_toml(tmp_path, monkeypatch):
    monkeypatch.setenv("MONARCH_NB_HOME", str(tmp_path))
    (tmp_path / "config.toml").write_text("[logs]\nmax_mb = 2\nmax_age_days = 0.5\n")
    store = LogStore(tmp_path)
    assert (store.writing()["max_bytes"], store.writing()["max_age_s"]) == (2 * 2**20, 43_200.0)
    store.close(CLOSE_S)


def test_a_mistake_in_config_toml_stops_a_cluster_from_starting_and_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MONARCH_NB_HOME", str(tmp_path))
    (tmp_path / "config.toml").write_text("[logs]\nmax_mbs = 3\n")
    with pytest.raises(ValueError, match=r"config.toml: \[logs\] has no setting 'max_mbs'; known: max_mb"):
        Cluster.start_ephemeral()
    with pytest.raises(ValueError, match=r"config.toml: \[logs\] has no setting 'max_mbs'"):
        Cluster.start("typo")
    assert not any((tmp_path / "clusters").glob("*")), "no cluster directory is left behind"


def test_a_query_returns_at_most_its_limit_the_oldest_first(tmp_path):
    store = LogStore(tmp_path, ring_lines=100)
    store.add("host0", lines(1_000))
    assert [r[0] for r in store.query(limit=5)] == [1, 2, 3, 4, 5]  # the database, not the ring's
    assert [r[0] for r in store.query(limit=5, after_seq=998)] == [999, 1_000]
    store.close(CLOSE_S)


def test_a_stopped_clusters_store_is_kept_readable_and_only_the_newest_are(tmp_path, monkeypatch):
    monkeypatch.setenv("MONARCH_NB_HOME", str(tmp_path))
    monkeypatch.setattr(logstore, "KEPT_STOPPED", 2)
    kept = tmp_path / "stopped"
    for n, name in enumerate(["a", "b", "c"]):
        cluster = tmp_path / "clusters" / name
        cluster.mkdir(parents=True)
        store = LogStore(cluster, ring_lines=10)
        store.add("host0", lines(100, mesh=name))
        store.close(CLOSE_S)
        logstore.keep(cluster / "logs" / logstore.DB_FILE, kept / f"{name}.sqlite")
        os.utime(kept / f"{name}.sqlite", (NOW + n, NOW + n))  # stopped in this order
    assert sorted(p.name for p in kept.iterdir()) == ["b.sqlite", "c.sqlite"]  # "a", the oldest, is forgotten
    found = logstore.read_kept(kept / "c.sqlite", mesh="c", ranks=[1], tail=2)
    assert [r[8] for r in found] == ["line 93", "line 97"]
    assert [r[0] for r in logstore.read_kept(kept / "b.sqlite", after_seq=98)] == [99, 100]
    with pytest.raises(re.error):
        logstore.read_kept(kept / "b.sqlite", grep="line (")


class _FullDisk:
    """A disk that fills up and is freed: while ``full``, the store's inserts fail as
    sqlite fails them on a full disk, and so does every write to stderr (hub.log is on
    the same disk)."""

    def __init__(self, monkeypatch):
        self.full = False
        disk = self
        real_connect = logstore._connect

        class Connection:
            def __init__(self, conn):
                self._conn = conn

            def executemany(self, sql, rows):
                if disk.full:
                    raise sqlite3.OperationalError("database or disk is full")
                return self._conn.executemany(sql, rows)

            def __getattr__(self, name):
                return getattr(self._conn, name)

        class Stderr(io.StringIO):
            def write(self, text):
                if disk.full:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return super().write(text)

        monkeypatch.setattr(logstore, "_connect", lambda db, readonly=False: (
            real_connect(db, readonly) if readonly else Connection(real_connect(db))))
        self.stderr = Stderr()
        monkeypatch.setattr(sys, "stderr", self.stderr)


def test_a_full_disk_is_reported_and_counted_and_writing_resumes_when_space_returns(tmp_path, monkeypatch):
    disk = _FullDisk(monkeypatch)
    monkeypatch.setattr(logstore, "RETRY_S", 0.05)
    monkeypatch.setattr(logstore, "CATCH_UP_S", 3600.0)  # a query that waited for the writer would hang
    store = LogStore(tmp_path, ring_lines=100)
    store.add("host0", lines(10))
    assert wait_until(lambda: store.writing()["lines"] == 10, 30)
    disk.full = True
    store.add("host0", lines(250, start=10))
    # The store says it is failing, and counts what it had to let go (the ring and the
    # backlog each keep the newest 100).
    assert wait_until(lambda: not store.writing()["ok"], 30), store.writing()
    assert "disk is full" in store.writing()["error"]
    assert wait_until(lambda: store.writing()["lost"] == 150, 30), store.writing()
    store.add("host0", lines(20, start=260))
    assert wait_until(lambda: store.writing()["lost"] == 170, 30), store.writing()
    assert store.writing()["unwritten"] == 100
    # A query answers with what there is, without waiting for a writer that can't write.
    found: list = []
    query = threading.Thread(target=lambda: found.extend(store.query()))
    query.start()
    query.join(60)
    assert not query.is_alive(), "the query waited for the failing writer"
    assert [r[0] for r in found] == list(range(1, 11)) + list(range(181, 281))
    # Space returns: the kept lines are written, and the store says so.
    disk.full = False
    assert wait_until(lambda: store.writing()["ok"] and store.writing()["unwritten"] == 0, 30), store.writing()
    assert "writing the log store" in disk.stderr.getvalue()
    store.add("host0", lines(5, start=280))
    store.close(CLOSE_S)
    with contextlib.closing(sqlite3.connect(tmp_path / "logs" / logstore.DB_FILE)) as db:
        stored = [seq for (seq,) in db.execute("SELECT seq FROM lines ORDER BY seq")]
    assert stored == list(range(1, 11)) + list(range(181, 286))
    assert store.writing()["lost"] == 170


def test_the_writer_survives_a_failure_it_did_not_expect(tmp_path, monkeypatch):
    monkeypatch.setattr(logstore, "RETRY_S", 0.05)
    store = LogStore(tmp_path, ring_lines=100)
    writer = store._writer
    assert writer is not None
    real_write = writer._write
    failing = [True]

    def write():
        if failing[0]:
            raise RuntimeError("a bug in the writer")
        return real_write()

    monkeypatch.setattr(writer, "_write", write)
    store.add("host0", lines(3))
    assert wait_until(lambda: not store.writing()["ok"], 30), store.writing()
    assert "a bug in the writer" in store.writing()["error"]
    failing[0] = False
    assert wait_until(lambda: store.writing()["ok"] and store.writing()["lines"] == 3, 30), store.writing()
    store.close(CLOSE_S)
