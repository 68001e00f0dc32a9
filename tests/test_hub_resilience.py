"""The hub and host agents hold up: a stalled hub (SIGSTOP, a long log query) does not
blame its healthy hosts, a host heard again after being lost is taken back, a full
disk degrades the log store instead of deafening the hub, malformed messages are
answered or dropped and counted, and spawn/stop cycles leave no sockets behind."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sqlite3
import threading
import time

import psutil
import pytest
import zmq

from monarch_nb import cluster_dir
from monarch_nb.actor import Actor, ClusterError, SupervisionError, endpoint
from monarch_nb.client.cluster import Cluster
from monarch_nb.client.launch import HUB_LOG, launch_hub
from monarch_nb.client.runtime import runtime
from monarch_nb.hub.logstore import LogStore
from monarch_nb.wire import frames as wire_frames
from monarch_nb.wire import zap

from conftest import cluster_processes, wait_until

_names = itertools.count()


class Echo(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def say(self, text: str, times: int = 1) -> None:
        for _ in range(times):
            print(text, flush=True)


@pytest.fixture
def retained():
    """Start retained clusters (``grace_s`` long enough to outlive a stopped hub);
    ``prepare(path)`` may set up the cluster directory before the hub starts. Every
    one is stopped afterwards, leaving no process and no directory."""
    started: list[Cluster] = []

    def start(grace_s: float = 30.0, prepare=None) -> Cluster:
        name = f"resilience-{os.getpid()}-{next(_names)}"
        path, _ = cluster_dir.create(name)
        if prepare is not None:
            prepare(path)
        launch_hub(path, hosts=1, grace_s=grace_s)
        c = Cluster(name, path, cluster_dir.read_info(path))._attach()
        started.append(c)
        return c

    yield start
    for c in started:
        for pid in [p.pid for p in cluster_processes(c.path)]:
            try:
                os.kill(pid, signal.SIGCONT)  # a test that failed while something was stopped
            except ProcessLookupError:
                pass
        c.stop()
        assert wait_until(lambda: not cluster_processes(c.path), 15), cluster_processes(c.path)
        assert not c.path.exists(), f"{c.path} left behind"
    if runtime().cluster is not None:
        runtime().cluster.disconnect()
        runtime().cluster = None


def _all_healthy(c: Cluster) -> bool:
    """Every host healthy and no proc failed or lost (on a loaded machine a proc may
    briefly show "unresponsive": its status answer took over a second)."""
    tree = c.health()
    return (all(h["state"] == "healthy" for h in tree["hosts"])
            and tree["counts"]["failed"] + tree["counts"]["lost"] == 0)


def _hub_log(c: Cluster) -> str:
    return (c.path / HUB_LOG).read_text(errors="replace")


def _send_raw(address: str, frames: list) -> None:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)
    zap.present(sock, wire_frames.cluster_of(frames) or b"")  # admitted: what it sends is what is tested
    sock.connect(address)
    sock.send_multipart(frames)
    sock.close()


def test_a_hub_stopped_for_10_s_finds_every_host_and_proc_healthy_and_calls_still_work(retained):
    c = retained(grace_s=30.0)
    mesh = c.host_mesh().spawn_procs(per_host={"gpus": 2}, name="p").spawn("echo", Echo)
    pids = mesh.pid.call().get(timeout=30).values()
    hub = psutil.Process(c.info()["hub_pid"])
    hub.suspend()
    try:
        time.sleep(10.0)  # the stall itself (a laptop suspend), not a wait for a condition
    finally:
        hub.resume()
    assert wait_until(lambda: c.info()["hub_stats"]["stalls"] >= 1, 30)
    assert _all_healthy(c), c.health()["summary"]
    # The handles from before the stall still call the same actors: nobody declared them gone.
    assert mesh.pid.call().get(timeout=30).values() == pids
    # And it stays so for longer than the hub's silence bound (3 s: 6 heartbeats).
    heard = c.info()["hosts"][0]["heartbeats"]
    assert wait_until(lambda: c.info()["hosts"][0]["heartbeats"] > heard + 8, 30)
    assert _all_healthy(c), c.health()["summary"]
    assert mesh.pid.call().get(timeout=30).values() == pids
    assert "silent for" not in _hub_log(c), _hub_log(c)


def test_a_host_agent_heard_again_after_it_was_lost_is_taken_back_with_its_procs(retained):
    c = retained(grace_s=30.0)
    procs = c.host_mesh().spawn_procs(per_host={"gpus": 2}, name="p")
    mesh = procs.spawn("echo", Echo)
    pids = mesh.pid.call().get(timeout=30).values()
    agent = psutil.Process(c.info()["hosts"][0]["pid"])
    agent.suspend()  # its procs run on; the hub hears nothing from the agent
    try:
        assert wait_until(lambda: c.health()["hosts"][0]["state"] == "lost", 30)
        os.kill(pids[1], signal.SIGKILL)  # dies while nobody watches
    finally:
        agent.resume()
    assert wait_until(lambda: c.health()["hosts"][0]["state"] == "healthy", 30), c.health()["summary"]

    def states():
        return {p["pid"]: (p["state"], p["cause"]) for p in c.health()["hosts"][0]["procs"]}

    assert wait_until(lambda: states() == {pids[0]: ("healthy", None), pids[1]: ("failed", "killed by SIGKILL")},
                      30), states()
    # The handle from before the loss calls the live rank again (once this client has the
    # hub's actors_back: it called it gone with its host until then), as does a handle from
    # the registry.
    def answers(handle) -> bool:
        try:
            return handle.slice(gpus=0).pid.call_one().get(timeout=30) == pids[0]
        except SupervisionError:
            return False

    assert wait_until(lambda: answers(mesh), 30)
    assert answers(c.actor_meshes["echo"])
    assert "heard from again" in _hub_log(c)


def test_a_long_log_query_from_disk_does_not_make_the_host_lost(retained):
    seeded = 1_500_000  # far past the ring: the query reads them all from disk (seconds)

    def seed(path):
        store = LogStore(path, ring_lines=1000)
        now = time.time()
        for start in range(1, seeded + 1, 10_000):
            store.add("host0", [(now, f"{mesh}/{rank}", "stdout", mesh, rank, None, f"line {seq}", 8)
                                for seq in range(start, start + 10_000)
                                for mesh, rank in [("m", 0) if seq % 1000 == 0 else ("other", seq % 7)]])
        store.close(timeout=300)

    c = retained(grace_s=30.0, prepare=seed)
    mesh = c.host_mesh().spawn_procs(per_host={"gpus": 1}, name="p").spawn("echo", Echo)
    pid = mesh.pid.call_one().get(timeout=30)
    result: dict = {}
    # A pattern is tried on every stored line (no index helps): the longest query there is.
    query = threading.Thread(target=lambda: result.update(lines=c.logs(grep="000$")))
    query.start()
    answered = 0
    try:
        # While the hub reads the file it keeps serving: requests that only the hub
        # answers come back (health also waits up to 1 s on each proc's status, which
        # on a loaded machine would count the procs' speed, not the hub's), and the
        # host is never declared lost.
        while query.is_alive():
            assert not any(h["lost"] for h in c.info()["hosts"])
            answered += query.is_alive()
            query.join(0.05)
    finally:
        query.join()
    assert [r["seq"] for r in result["lines"]] == list(range(1000, seeded + 1, 1000))
    assert answered >= 3, "the hub did not answer while it read its log store"
    assert _all_healthy(c), c.health()["summary"]
    assert mesh.pid.call_one().get(timeout=30) == pid
    assert "silent for" not in _hub_log(c)


def test_a_full_disk_degrades_the_log_store_and_the_hub_keeps_serving(retained):
    def full_disk(path):
        (path / "logs" / "lines.sqlite").mkdir(mode=0o700, parents=True)  # no database can be made there

    c = retained(prepare=full_disk)
    mesh = c.host_mesh().spawn_procs(per_host={"gpus": 1}, name="p").spawn("echo", Echo)
    mesh.say.call_one("before the disk is freed", 3).get(timeout=30)
    assert wait_until(lambda: not c.info()["hub_stats"]["log_store"]["ok"], 30)
    assert "unable to open database file" in c.info()["hub_stats"]["log_store"]["error"]
    # The hub still serves: lines from its ring, calls, new procs.
    assert wait_until(lambda: len(c.logs(mesh="echo", grep="before")) == 3, 30)
    c.host_mesh().spawn_procs(per_host={"gpus": 1}, name="q").stop()
    log = _hub_log(c)
    assert log.count("could not write the log store") == 1, log
    # The disk is freed: the store writes again, the lines kept meanwhile included.
    store = c.path / "logs" / "lines.sqlite"
    store.rmdir()
    mesh.say.call_one("after", 1).get(timeout=30)
    assert wait_until(lambda: c.info()["hub_stats"]["log_store"]["ok"], 30)

    def stored(text: str) -> int:
        with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
            return db.execute("SELECT count(*) FROM lines WHERE text LIKE ?", (text + "%",)).fetchone()[0]

    assert wait_until(lambda: stored("after") == 1, 30)
    assert stored("before the disk is freed") == 3
    assert "writing the log store" in _hub_log(c)


def test_a_signed_malformed_message_gets_an_error_reply_and_the_hub_keeps_serving(retained):
    c = retained()
    # With a reply port: the caller hears what was wrong.
    with pytest.raises(ClusterError, match="hub failed on log_lines: KeyError"):
        c.hub.request("log_lines", timeout=30)
    with pytest.raises(ClusterError, match="hub failed on spawn_procs"):
        c.hub.request("spawn_procs", timeout=30)
    # Without one: dropped and counted. The receive loop lives on.
    cluster_id = c._info["cluster_id"]
    before = c.info()["hub_stats"]
    _send_raw(c._info["hub"], wire_frames.encode(cluster_id, {"op": "log_lines"}))
    _send_raw(c._info["hub"], wire_frames.encode(cluster_id, {"op": "agent_alive"}))
    assert wait_until(lambda: c.info()["hub_stats"]["malformed"] >= before["malformed"] + 2, 30)
    assert c.info()["hub_stats"]["dropped_frames"] >= before["dropped_frames"] + 2
    # Its host is not lost for it (the hub still hears the agent), and it still spawns.
    mesh = c.host_mesh().spawn_procs(per_host={"gpus": 1}, name="p").spawn("echo", Echo)
    assert mesh.pid.call_one().get(timeout=30) > 0
    assert wait_until(lambda: _all_healthy(c), 10)
    assert "silent for" not in _hub_log(c)


def test_a_malformed_message_to_a_host_agent_is_counted_and_the_agent_keeps_serving(retained):
    c = retained()
    [host] = c.info()["hosts"]
    cluster_id = c._info["cluster_id"]
    for header in ({"op": "adopt"}, {"op": "spawn_procs"}, {"op": "proc_ready"}, {"op": "stop_procs"}):
        _send_raw(host["address"], wire_frames.encode(cluster_id, header))
    assert wait_until(lambda: c.info()["hosts"][0]["dropped_frames"] >= 4, 30), c.info()["hosts"]
    mesh = c.host_mesh().spawn_procs(per_host={"gpus": 1}, name="p").spawn("echo", Echo)
    assert mesh.pid.call_one().get(timeout=30) > 0
    assert _all_healthy(c)


def test_dropped_frame_counts_of_the_hub_and_each_agent_show_in_info_and_health(retained):
    c = retained()
    [host] = c.info()["hosts"]
    forged = wire_frames.encode(c._info["cluster_id"], {"op": "info"})
    forged[1] = forged[1] + b"tampered"  # the signature no longer matches
    _send_raw(c._info["hub"], forged)
    _send_raw(host["address"], forged)
    assert wait_until(lambda: c.info()["hub_stats"]["dropped_frames"] >= 1, 30)
    assert wait_until(lambda: c.info()["hosts"][0]["dropped_frames"] >= 1, 30)
    tree = c.health()
    assert tree["hub"]["dropped_frames"] >= 1 and tree["hosts"][0]["dropped_frames"] >= 1


def _hub_usage(pid: int) -> tuple[int, int]:
    p = psutil.Process(pid)
    return p.num_fds(), p.memory_info().rss


def test_spawn_stop_cycles_leave_the_hub_with_a_flat_number_of_fds():
    c = Cluster.start_ephemeral()
    try:
        hub_pid = c.info()["hub_pid"]
        host = c.host_mesh()

        def cycle(i: int) -> None:
            procs = host.spawn_procs(per_host={"gpus": 4}, name=f"cycle{i % 3}")
            procs.spawn("echo", Echo).pid.call().get(timeout=60)
            procs.stop()

        for i in range(2):  # warm-up: sockets to the client and agent, caches, the ring
            cycle(i)
        fds0, rss0 = _hub_usage(hub_pid)
        # As many as fit in ~30 s, at least 8: a socket kept per dead proc would be 32 fds.
        deadline = time.monotonic() + 30
        cycles = 0
        while cycles < 8 or (time.monotonic() < deadline and cycles < 40):
            cycle(cycles)
            cycles += 1
        # Sockets closed with a linger may take a moment to let go of their fds.
        assert wait_until(lambda: _hub_usage(hub_pid)[0] <= fds0 * 1.1 + 1, 10), (
            f"hub fds {fds0} -> {_hub_usage(hub_pid)[0]} after {cycles} cycles")
        assert c.info()["hub_stats"]["sockets"] <= 6  # the agent and this client's inboxes, not dead procs'
        rss = _hub_usage(hub_pid)[1]
        assert rss - rss0 < 30 << 20, f"hub RSS {rss0 >> 20} -> {rss >> 20} MiB after {cycles} cycles"
    finally:
        c.stop()
    assert wait_until(lambda: not cluster_processes(c.path), 15)


def test_spawn_call_stop_cycles_leave_the_client_with_a_flat_number_of_fds():
    c = Cluster.start_ephemeral()
    client = psutil.Process()
    supervision = runtime().supervision
    try:
        host = c.host_mesh()

        def cycle(i: int) -> list[str]:
            procs = host.spawn_procs(per_host={"gpus": 4}, name=f"cycle{i % 3}")
            actors = procs.spawn("echo", Echo)
            actors.pid.call().get(timeout=60)
            procs.stop()
            return actors._addresses

        def heard_gone(addresses: list[str]) -> bool:  # the hub's actors_gone reached this client
            return all(supervision.why_dead(c.hub.cluster_id, a) is not None for a in addresses)

        # Warm-up: the event inbox, the sockets to the hub and to this mailbox.
        warm = cycle(0)
        assert wait_until(lambda: heard_gone(warm), 20)
        fds0 = client.num_fds()
        for i in range(1, 11):
            last = cycle(i)
        assert wait_until(lambda: heard_gone(last), 20)
        # A socket kept per actor called would be 40 more fds, plus reconnection attempts;
        # sockets closed may take a moment to let go of theirs.
        assert wait_until(lambda: client.num_fds() <= fds0 + 8, 10), (
            f"client fds {fds0} -> {client.num_fds()} after 10 cycles")
    finally:
        c.stop()
    assert wait_until(lambda: not cluster_processes(c.path), 15)
