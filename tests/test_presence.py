"""A client's heartbeat to its hub (fast, no cluster): nothing a send raises ends it."""

from __future__ import annotations

import threading

from monarch_nb.client import presence
from monarch_nb.client.runtime import runtime
from monarch_nb.errors import ClusterError
from monarch_nb.wire import frames

from conftest import wait_until


def test_a_hub_that_refuses_the_heartbeat_does_not_end_the_heartbeat_thread(monkeypatch):
    # CI saw "Exception in thread monarch-nb-presence: ClusterError: ... refused the
    # connection" (another cluster's process on the dead hub's port): the thread ended,
    # and with it the watch that notices a lost hub.
    monkeypatch.setattr(presence, "HEARTBEAT_S", 0.01)
    frames.register_key("refusing", b"k" * 32)
    watched = threading.Semaphore(0)
    before = set(threading.enumerate())
    beat = presence.Presence("refusing", "tcp://127.0.0.1:9", watched.release)
    [heartbeat] = [t for t in set(threading.enumerate()) - before if t.name == "monarch-nb-presence"]

    def refuse(address, frames):
        raise ClusterError(f"{address} refused the connection")

    monkeypatch.setattr(runtime().mailbox, "send", refuse)
    try:
        assert all(watched.acquire(timeout=30) for _ in range(3))  # beats go on, each then watches
    finally:
        beat.close()  # the goodbye is refused too, quietly
    assert wait_until(lambda: not heartbeat.is_alive(), 30)
