"""A client that ran several clusters may still hold a socket to an address whose
process is gone when the OS gives that port to a process of another cluster: the old
socket presents the old cluster's credentials, which the new process refuses at the
handshake (wire.zap). Sending there for the new cluster must make a socket with the
new cluster's credentials, not queue the message on the old one, where it was dropped
without a word (a call to a fresh mesh that never returned, seen in CI runs)."""

from __future__ import annotations

import multiprocessing
import socket

from monarch_nb.wire import frames, sockets

_OLD, _NEW = "outbox-old-cluster", "outbox-new-cluster"


def _inbox_of_new_cluster(address: str, bound, received) -> None:
    frames.register_key(_NEW, b"n" * 64)  # this process holds the new cluster's key only
    inbox, _ = sockets.bind_inbox(prefer=address)
    bound.put(address)
    received.put(len(sockets.recv_frames(inbox)) if inbox.poll(30_000) else None)


def _free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_a_send_for_another_cluster_at_a_reused_address_is_delivered():
    frames.register_key(_OLD, b"o" * 64)
    frames.register_key(_NEW, b"n" * 64)
    address = _free_address()
    outbox = sockets.Outbox()
    outbox.connect([address], _OLD.encode())  # left from the old cluster's proc at this port
    ctx = multiprocessing.get_context("spawn")
    bound, received = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_inbox_of_new_cluster, args=(address, bound, received), daemon=True)
    child.start()
    try:
        assert bound.get(timeout=60) == address
        outbox.send(address, frames.encode(_NEW, {"op": "ping"}, b"hello"))
        assert received.get(timeout=60) is not None, "the message for the new cluster was dropped"
    finally:
        outbox.forget(address)
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join()
