"""Bad messages and replays: a message nobody can act on is refused or dropped and
counted, a replayed one is never acted on, and no thread dies of either."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings

import pytest
import zmq

from monarch_nb.errors import ActorError
from monarch_nb.wire import frames, zap
from bad_actors import Busy, SlowInit, Target
from conftest import wait_until


@pytest.fixture(scope="module")
def target(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="badmsg")
    yield procs.spawn("target", Target)
    procs.stop()


def _raw_send(address: str, *frame_sets: list, times: int = 1) -> None:
    """Send on one new connection, in order (a receiver keeps one connection's order)."""
    sock = zmq.Context.instance().socket(zmq.PUSH)
    zap.present(sock, frames.cluster_of(frame_sets[0]))  # admitted: the signature is what is tested
    sock.connect(address)
    for frame_set in frame_sets:
        for _ in range(times):
            sock.send_multipart(frame_set)
    sock.close(linger=5000)


def test_an_exception_whose_str_raises_still_fails_the_call_and_the_actor_lives_on(target):
    with pytest.raises(ActorError) as info:
        target.raise_unprintable.call_one().get(timeout=30)
    assert "Unprintable" in str(info.value)
    assert target.note.call_one(1).get(timeout=30) == 1


def test_a_reply_that_raises_systemexit_when_unpickled_fails_only_its_call(target):
    with pytest.raises(ActorError) as info:
        target.return_exiting.call_one().get(timeout=30)
    assert isinstance(info.value.failures[0].exception, SystemExit)

    async def twice():
        with pytest.raises(ActorError):
            await target.return_exiting.call_one()
        return await target.note.call_one(2)  # the pump that serves awaits is still there

    assert asyncio.run(twice()) == 2


def test_signed_calls_missing_keys_are_dropped_and_counted_and_the_actor_serves_on(target):
    before = target.dropped.call_one().get(timeout=30)
    address = target._addresses[0]
    for header in ({"ep": "note"}, {"k": "call"}, {"k": "nonsense"}):
        _raw_send(address, frames.encode_value(target._cluster_id, header, ((9,), {})))
    assert wait_until(lambda: target.dropped.call_one().get(timeout=30) == before + 3, 30)
    assert target.note.call_one(3).get(timeout=30) == 3
    assert 9 not in target.notes_seen.call_one().get(timeout=30)


def test_a_captured_call_replayed_runs_once(target):
    before = target.dropped.call_one().get(timeout=30)
    captured = frames.encode_value(target._cluster_id, {"k": "call", "ep": "note", "o": None}, (("once",), {}))
    _raw_send(target._addresses[0], captured, times=6)
    assert wait_until(lambda: target.dropped.call_one().get(timeout=30) == before + 5, 30)
    assert target.notes_seen.call_one().get(timeout=30).count("once") == 1


def test_a_replayed_stop_does_not_stop_a_new_mesh_of_the_same_name(cluster, host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="replay")
    try:
        first = procs.spawn("again", Target)
        stop = frames.encode(first._cluster_id, {"op": "stop_actors", "name": "again"})
        _raw_send(cluster._info["hub"], stop)
        assert wait_until(lambda: "again" not in cluster.actor_meshes, 30)  # the first one was real
        second = procs.spawn("again", Target)
        procs.spawn("marker", Target)
        # The replay, then a fresh stop of another mesh: once that one is gone, the hub
        # has handled the replay too.
        _raw_send(cluster._info["hub"], stop, frames.encode(first._cluster_id, {"op": "stop_actors", "name": "marker"}))
        assert wait_until(lambda: "marker" not in cluster.actor_meshes, 30)
        assert "again" in cluster.actor_meshes
        assert second.note.call_one(1).get(timeout=30) == 1
    finally:
        procs.stop()


def test_stopping_a_busy_mesh_interrupts_its_endpoint_and_ends_its_thread(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="stopbusy")
    try:
        watcher = procs.spawn("watcher", Busy)
        busy = procs.spawn("busy", Busy)
        running = busy.spin.call_one(600)
        assert wait_until(lambda: _state_of(procs, "busy") == "busy", 30)
        started = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "did not stop" warning
            busy.stop()
        assert time.monotonic() - started < 30
        with pytest.raises(Exception):
            running.get(timeout=30)
        assert wait_until(lambda: "actor-busy-0" not in watcher.actor_threads.call_one().get(timeout=30), 30)
        # Replacing a busy mesh ends the old actor's thread too.
        again = procs.spawn("again", Busy)
        again.spin.call_one(600)
        assert wait_until(lambda: _state_of(procs, "again") == "busy", 30)
        replaced = procs.spawn("again", Busy, replace=True)
        assert replaced.actor_threads.call_one().get(timeout=30).count("actor-again-0") == 1
    finally:
        procs.stop()


def test_a_mesh_that_will_not_stop_is_reported(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="stubborn")
    try:
        mesh = procs.spawn("stubborn", Busy)
        mesh.stubborn.call_one(20)
        assert wait_until(lambda: _state_of(procs, "stubborn") == "busy", 30)
        with pytest.warns(RuntimeWarning, match=r"rank 0 in stubborn did not return"):
            mesh.stop()
    finally:
        procs.stop()


def _state_of(procs, mesh: str) -> str | None:
    """What the hub's health says actor ``mesh`` (rank 0) is doing."""
    for host in procs._hub().request("health")["hosts"]:
        for proc in host["procs"]:
            for actor in proc.get("actors", []):
                if actor.get("mesh") == mesh:
                    return actor.get("state")
    return None


def test_a_spawn_whose_init_does_not_return_times_out_and_leaves_the_procs_usable(host):
    procs = host.spawn_procs(per_host={"gpus": 2}, name="slowinit")
    try:
        with pytest.raises(TimeoutError, match=r"SlowInit.__init__ did not return within 1.0 s"):
            procs.spawn("slow", SlowInit, 600, init_timeout=1.0)
        watcher = procs.spawn("watcher2", Busy)
        assert wait_until(lambda: not any("actor-slow-" in name for names in
                                          watcher.actor_threads.call().get(timeout=30).values() for name in names), 30)
        fast = procs.spawn("slow", Busy)  # the name is free again
        assert fast.spin.call(0).get(timeout=30).values() == ["done", "done"]
    finally:
        procs.stop()


def test_a_spawn_waiting_when_its_cluster_is_stopped_says_so():
    from monarch_nb.client.cluster import Cluster
    from monarch_nb.errors import ClusterError
    from conftest import cluster_processes

    own = Cluster.start_ephemeral()
    outcome: list[BaseException] = []
    try:
        procs = own.host_mesh().spawn_procs(per_host={"gpus": 1}, name="p")

        def spawn() -> None:
            try:
                procs.spawn("slow", SlowInit, 600)
            except BaseException as e:  # noqa: BLE001 - inspected below
                outcome.append(e)

        waiter = threading.Thread(target=spawn)
        waiter.start()
        assert wait_until(lambda: _proc_status(procs)["actors"].get("slow", {}).get("state") == "busy", 30)
    finally:
        own.stop()
    waiter.join(30)
    assert not waiter.is_alive(), "the spawn still waits after its cluster stopped"
    assert isinstance(outcome[0], ClusterError) and "was stopped" in str(outcome[0]), outcome
    assert wait_until(lambda: not cluster_processes(own.path), 15)


def _proc_status(procs) -> dict:
    """What rank 0's proc says its actors are doing (also those still constructing)."""
    from monarch_nb.client.runtime import runtime

    reply = runtime().mailbox.request(procs._procs[0]["address"], procs._cluster_id, {"op": "status"}, timeout=10)
    return reply.header


def test_a_spawn_of_a_billion_procs_is_refused_at_once_and_the_hub_serves_on(host):
    # A typo'd size once had the hub build tables until the out-of-memory killer took it.
    with pytest.raises(ValueError, match=r"1,000,000,000 procs on each host, more than the 1,024"):
        host.spawn_procs(per_host={"gpus": 10**9})
    hub = host._hub()
    # What a client that does not check sends: the hub refuses it too.
    with pytest.raises(ValueError, match="MONARCH_NB_MAX_PROCS_PER_HOST"):
        hub.request("spawn_procs", per_host={"gpus": 10**9}, hosts=None, host_extent={}, name="huge")
    procs = host.spawn_procs(per_host={"gpus": 1}, name="after_huge")
    try:
        assert procs.spawn("still", Target).note.call_one("served").get(timeout=60) == "served"
    finally:
        procs.stop()


def test_a_signed_debug_request_naming_no_reply_address_leaves_the_procs_debugger_serving(host):
    # A port without a reply address ended the proc's debugger thread (its error reply
    # failed as the request had): no breakpoint, stack or continue was answered again there.
    from monarch_nb.client.runtime import runtime
    from monarch_nb.protocol import debug as debug_ops
    from monarch_nb.protocol import envelope, proc_ops

    procs = host.spawn_procs(per_host={"gpus": 1}, name="baddebug")
    try:
        control, cid = procs._procs[0]["address"], procs._cluster_id

        def answered() -> bool:
            reply = runtime().mailbox.request(control, cid, {envelope.OP: proc_ops.DEBUG, debug_ops.ACTION: "nonsense"},
                                              timeout=10)
            return reply is not None and "error" in reply.value()

        assert answered()
        for header in ({envelope.OP: proc_ops.DEBUG, debug_ops.ACTION: "x", envelope.PORT: 1},
                       {envelope.OP: proc_ops.DEBUG, debug_ops.ACTION: debug_ops.STOPS, envelope.PORT: 1},
                       {envelope.OP: proc_ops.DEBUG, debug_ops.ACTION: "x", envelope.PORT: "1", envelope.REPLY: 5}):
            runtime().mailbox.send(control, frames.encode(cid, header))  # (the connection answered() takes: in order)
        assert answered()
    finally:
        procs.stop()
