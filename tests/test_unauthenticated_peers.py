"""What a peer without the cluster's key can make a process hold: no frame over
``frames.MAX_FRAME_BYTES`` is taken in (libzmq closes the connection at its length,
before allocating it), so huge unsigned frames cost the receiver nothing, while large
frames of the cluster's own go ahead as signed streams (``wire.stream``) or through
shared memory (``wire.shm``)."""

from __future__ import annotations

import zmq

from monarch_nb.wire import frames, sockets, stream, zap
from sample_actors import Counter
from second_user import run_as_other_user
from test_streams import Recorder

GIB = 1 << 30


def _send_unsigned(address: str, size: int, count: int) -> tuple[int, str]:
    """As the second user: ``count`` unsigned frames of ``size`` bytes to ``address``,
    each a message of its own; returns how many it tried to send and how the
    connection's handshake ended (the attacker has no password: ``wire.zap``)."""
    from zmq.utils.monitor import recv_monitor_message

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                      | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    sock.connect(address)
    junk = bytes(size)  # (zero pages: the attacker itself holds next to nothing)
    for _ in range(count):
        try:
            sock.send(junk, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            break  # refused already: libzmq dropped the connection's pipe, nothing to send on
    outcome = zmq.Event(recv_monitor_message(monitor)["event"]).name if monitor.poll(120_000) else "none"
    if outcome == "HANDSHAKE_SUCCEEDED":
        sock.close(linger=60_000)  # all of it written, or refused, before this returns
    else:
        sock.close(linger=0)
    monitor.close(0)
    ctx.term()
    return count, outcome


def _peak_rss(pid: int) -> int:
    """Peak resident memory of ``pid`` since its last reset (bytes)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def _reset_peak_rss(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # the peak is set back to what is resident now (Linux 4.0+)


def test_three_unsigned_1_gib_frames_from_another_user_leave_the_hub_bounded_and_working(cluster, host):
    hub_pid, hub = cluster._info["hub_pid"], cluster._info["hub"]
    _reset_peak_rss(hub_pid)
    baseline = _peak_rss(hub_pid)
    # Refused at the handshake now (wire.zap), before any frame: without the key there is
    # no connection to send on. (Before that, frames of 4 MiB or more closed it at their length.)
    sent, handshake = run_as_other_user(_send_unsigned, hub, GIB, 3, timeout=180)
    assert sent == 3 and handshake.startswith("HANDSHAKE_FAILED"), handshake
    procs = host.spawn_procs(per_host={"gpus": 1}, name="after_flood")
    try:
        assert procs.spawn("counter", Counter, 1).incr.call_one(2).get(timeout=60) == 3
    finally:
        procs.stop()
    grown = _peak_rss(hub_pid) - baseline
    assert grown < 300 << 20, f"the hub's peak resident memory grew by {grown >> 20} MiB"
    assert cluster.info()["hub_pid"] == hub_pid


def test_an_inbox_refuses_a_frame_over_the_limit_without_holding_it():
    frames.register_key("bounds", b"b" * 32)
    inbox, address = sockets.bind_inbox()
    out = zmq.Context.instance().socket(zmq.PUSH)
    monitor = inbox.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        zap.present(out, "bounds")  # a peer admitted at the handshake (wire.zap) is still bounded
        out.connect(address)
        out.send(bytes(frames.MAX_FRAME_BYTES + 1))
        assert monitor.poll(30_000), "the inbox kept the connection of an oversized frame"
        out.send(b"small")  # (reconnected) a frame within the limit still arrives
        assert inbox.poll(30_000) and inbox.recv() == b"small"
    finally:
        inbox.disable_monitor()
        monitor.close(0)
        out.close(0)
        inbox.close(0)


def test_no_frame_to_another_host_is_over_the_limit_even_a_large_header_or_body():
    frames.register_key("bounds", b"b" * 32)
    sock, trackers = Recorder(), []
    big_body = list(range(2_000_000))  # pickled in the body itself: ~10 MiB, no out-of-band buffer
    encoded = frames.encode_value("bounds", {"note": "x" * (2 * stream.MIN_BYTES)}, big_body)
    assert frames.needs_route(encoded)
    final = frames.route("tcp://10.0.0.1:5", encoded, lambda head, view, key: stream.send(sock, trackers, head,
                                                                                           view, key))
    messages = [*sock.messages, list(final)]
    assert max(len(f) for m in messages for f in m) <= frames.MAX_FRAME_BYTES
    guard = frames.ReplayGuard()
    for message in messages[:-1]:
        try:
            frames.decode(message, guard)
        except frames.Absorbed:
            pass
    got = frames.decode(messages[-1], guard)
    assert got.header["note"] == "x" * (2 * stream.MIN_BYTES) and got.value() == big_body

