"""A dying proc's last words (its last stderr lines, quoted in its failure) come from
lines kept by proc: found at once whatever the other procs wrote since, with no scan of
the log ring on the hub's loop."""

from __future__ import annotations

from monarch_nb.hub import logstore
from monarch_nb.hub.logstore import LogStore


def _lines(proc: str, stream: str, texts: list[str]) -> list[tuple]:
    return [(0.0, proc, stream, None, None, None, text, len(text)) for text in texts]


def test_a_quiet_procs_last_words_are_found_after_a_chatty_cluster_filled_the_ring():
    store = LogStore(None, ring_lines=50_000)
    store.add("host0", _lines("train/3", "stderr", [f"warning {i}" for i in range(100)] + ["CUDA error: out of memory"]))
    store.add("host0", _lines("train/0", "stdout", [f"step {i}" for i in range(30_000)]))  # the others talk on
    last = store.last("train/3", "stderr", 3)
    assert [r[8] for r in last] == ["warning 98", "warning 99", "CUDA error: out of memory"]
    assert store.last("train/0", "stderr", 80) == []  # wrote nothing there
    assert len(store.last("train/3", "stderr", 80)) == 80


def test_procs_whose_last_words_were_dropped_are_found_in_the_ring(monkeypatch):
    monkeypatch.setattr(logstore, "LAST_WORDS_PROCS", 2)
    store = LogStore(None)
    for proc in ("a/0", "a/1", "a/2"):  # a/0 is dropped from what is kept by proc
        store.add("host0", _lines(proc, "stderr", [f"{proc} died"]))
    assert [r[8] for r in store.last("a/0", "stderr", 5)] == ["a/0 died"]
    assert [r[8] for r in store.last("a/2", "stderr", 5)] == ["a/2 died"]
    assert store.last("a/9", "stderr", 5) == []
