"""The health tree kept by the hub from the host agents' heartbeats and pushed to
subscribers as deltas (issue 24 item 5).

Fast tier (no processes): deltas turn one tree into another, figures that move on
their own can wait, and the hub answers from fresh heartbeat statuses without asking
any proc. With a cluster: health() sends no status request to a proc while heartbeats
are fresh, a subscriber hears a death and a busy actor as deltas, and a proc that stops
answering still shows unresponsive."""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from monarch_nb.actor import Actor, endpoint
from monarch_nb.client.health_watch import HealthWatch
from monarch_nb.hub.health import STATUS_FRESH_S, Health
from monarch_nb.protocol import agent_ops, envelope, health_tree, hub_ops
from monarch_nb.protocol.states import HealthState

from conftest import wait_until


# -- fast tier: deltas --------------------------------------------------------------------

def _proc(rank: int, state: str = "healthy", rss: int = 1000, actors=()) -> dict:
    return {"proc_id": f"m/{rank}", "rank": rank, "state": state, "pid": 100 + rank, "rss_bytes": rss,
            "uptime_s": 1.0, "actors": [{"mesh": "a", "rank": rank, "class": "C", "state": s} for s in actors]}


def _tree(procs: list[dict], summary: str = "2/2 procs healthy") -> dict:
    return {"cluster": "c", "state": "healthy", "summary": summary, "counts": {"healthy": len(procs)},
            "hosts": [{"host_id": "host0", "state": "healthy", "gpus": [{"index": 0}], "procs": procs}],
            "actor_meshes": [], "services": [], "starting": [], "hub": {"sockets": 3}}


def _roundtrip(old: dict, new: dict, skip=None) -> dict:
    return health_tree.apply(copy.deepcopy(old), copy.deepcopy(health_tree.diff(old, new, skip)))


def test_a_delta_turns_the_old_tree_into_the_new_one():
    old = _tree([_proc(0, actors=["healthy"]), _proc(1), _proc(2)])
    new = _tree([_proc(2), _proc(0, "busy", actors=["busy"]), _proc(3, "failed")], summary="changed")
    assert _roundtrip(old, new) == new  # a state changed, a node left, one came, the order changed


def test_a_delta_carries_only_what_changed():
    old = _tree([_proc(i) for i in range(64)])
    new = copy.deepcopy(old)
    new["hosts"][0]["procs"][17]["state"] = "busy"
    delta = health_tree.diff(old, new)
    assert delta == {health_tree.KEYS: {"hosts": {health_tree.ITEMS: {"host_id=host0": {health_tree.KEYS: {
        "procs": {health_tree.ITEMS: {"proc_id=m/17": {health_tree.KEYS: {"state": {health_tree.SET: "busy"}}}}}}}}}}}
    assert health_tree.diff(old, copy.deepcopy(old)) is None


def test_volatile_figures_wait_but_states_and_new_nodes_do_not():
    old = _tree([_proc(0), _proc(1)])
    new = _tree([_proc(0, rss=5000), _proc(1, "failed"), _proc(2, rss=7)])
    new["hub"] = {"sockets": 9}
    got = _roundtrip(old, new, skip=health_tree.VOLATILE.__contains__)
    procs = {p["proc_id"]: p for p in got["hosts"][0]["procs"]}
    assert procs["m/0"]["rss_bytes"] == 1000 and got["hub"] == {"sockets": 3}  # left for the next refresh
    assert procs["m/1"]["state"] == "failed" and procs["m/2"]["rss_bytes"] == 7
    assert health_tree.diff(old, old | {"hub": {"sockets": 9}}, health_tree.VOLATILE.__contains__) is None


def test_a_state_enum_and_its_word_are_no_change():
    old = _tree([_proc(0)])
    new = copy.deepcopy(old)
    new["hosts"][0]["procs"][0]["state"] = HealthState.HEALTHY
    assert health_tree.diff(old, new) is None


def test_a_delta_that_does_not_fit_says_to_ask_for_the_whole_tree():
    with pytest.raises(ValueError, match="ask for the whole tree"):
        health_tree.apply(3, {health_tree.KEYS: {"a": {health_tree.SET: 1}}})


# -- fast tier: the hub answers from heartbeats ------------------------------------------

class _CountingNet:
    """Answers every ``status`` at once, counting them, except for ``silent`` addresses."""

    def __init__(self, silent=()):
        self.asked: list[str] = []
        self.silent = set(silent)

    async def request(self, address, header, timeout=None):
        self.asked.append(address)
        if address in self.silent:
            await asyncio.sleep(timeout)
            raise TimeoutError(address)
        return SimpleNamespace(header={"actors": {}, "asked": True})


def _live(n: int, host_id: str = "h0") -> list:
    return [SimpleNamespace(proc_id=f"m/{i}", address=f"tcp://p{i}", exit_code=None, host_id=host_id)
            for i in range(n)]


_NO_AGENTS = SimpleNamespace(hosts={})  # a registry whose hosts' agents are unknown: procs are asked directly


def test_fresh_heartbeat_statuses_answer_without_asking_any_proc():
    live = _live(128)
    net = _CountingNet()
    health = Health("c", registry=_NO_AGENTS, net=net, meshes=None, hub_stats=dict)
    health.heard({p.proc_id: [0.2, {"actors": {}, "rss_bytes": 1}, p.address] for p in live}, time.monotonic())
    statuses = asyncio.run(health.statuses(live))
    assert net.asked == [] and health.probes == 0
    assert statuses == {p.proc_id: {"actors": {}, "rss_bytes": 1} for p in live}


def test_a_stale_status_is_asked_again_and_a_silent_proc_has_none():
    live = _live(3)
    net = _CountingNet(silent={"tcp://p2"})
    health = Health("c", registry=_NO_AGENTS, net=net, meshes=None, hub_stats=dict)
    now = time.monotonic()
    health.heard({"m/0": [0.0, {"actors": {}}, "tcp://p0"],
                  "m/1": [STATUS_FRESH_S + 1, {"actors": {}}, "tcp://p1"],  # heard too long ago
                  "m/2": [STATUS_FRESH_S + 1, {"actors": {}}, "tcp://p2"]}, now)
    statuses = asyncio.run(health.statuses(live))
    assert sorted(net.asked) == ["tcp://p1", "tcp://p2"] and health.probes == 2
    assert statuses["m/0"] == {"actors": {}} and statuses["m/1"]["asked"] and statuses["m/2"] is None


class _AgentNet(_CountingNet):
    """Also plays host agents: ``agents`` maps an agent's address to the proc ids it
    answers ``ask_statuses`` for (``None``: it refuses the op, as an older agent does)."""

    def __init__(self, agents: dict):
        super().__init__()
        self.agents = agents

    async def request(self, address, header, timeout=None):
        if address not in self.agents:
            return await super().request(address, header, timeout)
        self.asked.append(address)
        answers = self.agents[address]
        if answers is None:
            return SimpleNamespace(header={envelope.OK: False, "error": "unknown op"})
        assert header[envelope.OP] == agent_ops.ASK_STATUSES
        statuses = {p: [0.0, {"actors": {}, "by_agent": True}, f"tcp://p{p[2:]}"]
                    for p in header[agent_ops.PROC_IDS] if p in answers}
        return SimpleNamespace(header={envelope.OK: True, hub_ops.AGENT_STATUSES: statuses})


def test_stale_statuses_are_asked_of_each_host_agent_once_and_what_it_lacks_of_the_procs():
    live = _live(3, "h0") + [SimpleNamespace(proc_id="m/9", address="tcp://p9", exit_code=None, host_id="h1")]
    agents = {"tcp://agent0": {"m/0", "m/1"}, "tcp://agent1": None}  # m/2 unknown to h0's; h1's too old
    registry = SimpleNamespace(hosts={"h0": SimpleNamespace(address="tcp://agent0", lost=False),
                                      "h1": SimpleNamespace(address="tcp://agent1", lost=False)})
    net = _AgentNet(agents)
    health = Health("c", registry=registry, net=net, meshes=None, hub_stats=dict)
    statuses = asyncio.run(health.statuses(live))
    assert sorted(net.asked) == ["tcp://agent0", "tcp://agent1", "tcp://p2", "tcp://p9"]
    assert health.probes == 2  # the procs this hub asked itself
    assert statuses["m/0"]["by_agent"] and statuses["m/1"]["by_agent"]
    assert statuses["m/2"]["asked"] and statuses["m/9"]["asked"]
    net.asked.clear()
    asyncio.run(health.statuses(live))
    assert net.asked == []  # fresh now, from either source


def test_a_proc_that_did_not_answer_its_agent_is_unresponsive_without_asking_it_again():
    live = _live(1)
    net = _CountingNet()
    health = Health("c", registry=_NO_AGENTS, net=net, meshes=None, hub_stats=dict)
    health.heard({"m/0": [0.1, None, "tcp://p0"]}, time.monotonic())
    assert asyncio.run(health.statuses(live)) == {"m/0": None} and net.asked == []


def test_a_status_of_an_earlier_proc_of_the_same_id_is_not_used():
    live = _live(1)
    net = _CountingNet()
    health = Health("c", registry=_NO_AGENTS, net=net, meshes=None, hub_stats=dict)
    health.heard({"m/0": [0.0, {"actors": {}}, "tcp://the-proc-before-a-restart"]}, time.monotonic())
    assert asyncio.run(health.statuses(live))["m/0"]["asked"] and net.asked == ["tcp://p0"]


def test_an_activity_change_wakes_the_feed_and_a_usage_change_does_not():
    health = Health("c", registry=_NO_AGENTS, net=_CountingNet(), meshes=None, hub_stats=dict)
    woken = []
    health.on_activity = lambda: woken.append(1)
    idle = {"actors": {"a": {"state": "idle"}}, "rss_bytes": 1}
    health.heard({"m/0": [0.0, idle, "tcp://p0"]}, time.monotonic())
    health.heard({"m/0": [0.0, {**idle, "rss_bytes": 2}, "tcp://p0"]}, time.monotonic())
    assert len(woken) == 1  # the first status only
    health.heard({"m/0": [0.0, {"actors": {"a": {"state": "busy", "endpoint": "f", "since": 1.0}}},
                          "tcp://p0"]}, time.monotonic())
    assert len(woken) == 2


# -- with a cluster ---------------------------------------------------------------------

class Sleeper(Actor):
    @endpoint
    def nap(self, seconds: float) -> str:
        time.sleep(seconds)
        return "rested"

    @endpoint
    def nap_once_told(self, folder: str, seconds: float) -> str:
        from monarch_nb.actor import current_rank

        open(os.path.join(folder, str(current_rank().rank)), "w").close()  # the test knows it runs
        time.sleep(seconds)
        return "rested"

    @endpoint
    def nap_until_woken(self, folder: str) -> str:
        from monarch_nb.actor import current_rank

        open(os.path.join(folder, str(current_rank().rank)), "w").close()  # the test knows it runs
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(folder, "wake")) and time.monotonic() < deadline:
            time.sleep(0.05)
        return "rested"


@pytest.fixture
def feed_procs(host):
    procs = host.spawn_procs(per_host={"gpus": 4}, name="feed")
    sleepers = procs.spawn("sleepers", Sleeper)
    yield procs, sleepers
    procs.stop()


def _procs_of(tree: dict, mesh: str) -> dict[int, dict]:
    return {p["rank"]: p for h in tree["hosts"] for p in h["procs"] if p["proc_mesh"] == mesh}


def _all_heard(cluster, mesh: str) -> bool:
    """Two health() in a row with no probe: every proc's status came with a heartbeat."""
    before = cluster.health()["hub"]["status_probes"]
    after = cluster.health()
    return after["hub"]["status_probes"] == before and all(
        p["state"] == "healthy" for p in _procs_of(after, mesh).values())


def test_health_asks_no_proc_while_heartbeats_are_fresh(cluster, feed_procs):
    assert wait_until(lambda: _all_heard(cluster, "feed"), 15)
    probes = cluster.health()["hub"]["status_probes"]
    for _ in range(5):
        tree = cluster.health()
    assert tree["hub"]["status_probes"] == probes, "health() asked procs although heartbeats were fresh"
    assert all("rss_bytes" in p and "uptime_s" in p for p in _procs_of(tree, "feed").values())


def test_the_first_health_after_spawn_procs_or_spawning_actors_asks_nobody(cluster, host, tmp_path):
    # What the procs said as they started is fresh, and says all there is while no actor
    # runs there: the first health() after spawn_procs sends no status request at all.
    # Likewise after spawning actors: each proc's answer to the spawn carries its status,
    # the new actor idle. Before, that health() asked every proc again (256 procs on 2
    # cores: 150-220 ms, where one from heartbeats takes 2-3 ms).
    def unasked(tree, before) -> bool:
        return (tree["hub"]["status_probes"], tree["hub"]["status_asks"]) == \
            (before["status_probes"], before["status_asks"])

    before = cluster.health()["hub"]
    procs = host.spawn_procs(per_host={"gpus": 3}, name="fresh_statuses")
    try:
        tree = cluster.health()
        fresh = _procs_of(tree, "fresh_statuses")
        assert len(fresh) == 3 and all(p["state"] == "healthy" and "rss_bytes" in p for p in fresh.values())
        assert unasked(tree, before), "health() asked for statuses just reported"
        sleepers = procs.spawn("sleepers", Sleeper)
        tree = cluster.health()
        assert unasked(tree, before), "health() asked for statuses the actors' spawn reported"
        assert [a["state"] for p in _procs_of(tree, "fresh_statuses").values() for a in p["actors"]] == \
            ["healthy"] * 3
        napping = sleepers.nap_until_woken.call(str(tmp_path))
        assert wait_until(lambda: len(os.listdir(tmp_path)) == 3, 30)

        def busy() -> bool:  # the agents' polls bring it (health() was asked: they poll)
            return [a["state"] for p in _procs_of(cluster.health(), "fresh_statuses").values()
                    for a in p["actors"]] == ["busy"] * 3

        assert wait_until(busy, 30)
        (tmp_path / "wake").touch()
        assert napping.get(timeout=30).values() == ["rested"] * 3
    finally:
        procs.stop()


class _Feed:
    """A HealthWatch recording every tree it delivers."""

    def __init__(self, cluster, tick_s: float = 3600.0):
        self.trees: list[dict] = []
        self.ended: list[str] = []
        self.lock = threading.Lock()
        self.watch = HealthWatch(cluster, self._tree, self.ended.append, tick_s=tick_s)

    def _tree(self, tree: dict) -> None:
        with self.lock:
            self.trees.append(tree)

    def state(self, mesh: str, rank: int) -> str | None:
        with self.lock:
            return _procs_of(self.trees[-1], mesh).get(rank, {}).get("state") if self.trees else None


def test_a_subscriber_hears_a_proc_die_and_an_actor_get_busy_as_deltas(cluster, feed_procs):
    procs, sleepers = feed_procs
    feed = _Feed(cluster)
    try:
        assert wait_until(lambda: feed.state("feed", 3) == "healthy", 15)
        pending = sleepers.slice(gpus=1).nap.call_one(3.0)
        assert wait_until(lambda: feed.state("feed", 1) == "busy", 10)
        with feed.lock:
            busy = next(a for a in _procs_of(feed.trees[-1], "feed")[1]["actors"] if a["mesh"] == "sleepers")
        assert busy["endpoint"] == "nap"
        assert pending.get(timeout=30) == "rested"
        assert wait_until(lambda: feed.state("feed", 1) == "healthy", 10)
        os.kill(procs.pids[2], signal.SIGKILL)
        assert wait_until(lambda: feed.state("feed", 2) == "failed", 10)
        with feed.lock:
            dead = _procs_of(feed.trees[-1], "feed")[2]
        assert "killed by SIGKILL" in dead["cause"]
        assert feed.watch.subscriptions == 1, "the changes came as deltas, not by asking for the tree again"
        assert not feed.ended
    finally:
        feed.watch.stop(5)
    assert not feed.watch.running


def test_a_feed_of_a_quiet_cluster_delivers_nothing_new(cluster, feed_procs):
    feed = _Feed(cluster)  # figures that move on their own: only every hour
    try:
        assert wait_until(lambda: feed.state("feed", 3) == "healthy", 15)

        def quiet_for_a_second() -> bool:
            seen = feed.watch.refreshes
            return not wait_until(lambda: feed.watch.refreshes > seen, 1.0)

        assert wait_until(quiet_for_a_second, 10), "it keeps delivering trees without a change"
    finally:
        feed.watch.stop(5)


def test_a_proc_that_stops_answering_still_shows_unresponsive(cluster, feed_procs):
    procs, _ = feed_procs
    feed = _Feed(cluster)
    pid = procs.pids[0]
    try:
        assert wait_until(lambda: feed.state("feed", 0) == "healthy", 15)
        os.kill(pid, signal.SIGSTOP)  # alive, but neither its agent nor the hub gets an answer
        assert wait_until(lambda: feed.state("feed", 0) == "unresponsive", STATUS_FRESH_S + 10)
        assert _procs_of(cluster.health(), "feed")[0]["state"] == "unresponsive"
        os.kill(pid, signal.SIGCONT)
        assert wait_until(lambda: feed.state("feed", 0) == "healthy", 10)
    finally:
        os.kill(pid, signal.SIGCONT)
        feed.watch.stop(5)


def test_an_agent_asks_its_procs_only_while_someone_watches():
    from monarch_nb.host.status_poll import StatusPoll

    net = _CountingNet()
    poll = StatusPoll(net, {"m/0": "tcp://p0"})

    async def one_pass():
        task = asyncio.ensure_future(poll.run())
        await asyncio.sleep(0.05)
        task.cancel()

    asyncio.run(one_pass())
    assert net.asked == [] and poll.take() == {}
    poll.wanted = True
    asyncio.run(one_pass())
    assert net.asked == ["tcp://p0"] and list(poll.take()) == ["m/0"]


def test_statuses_an_agent_hears_while_its_heartbeat_takes_the_last_ones_are_kept_for_the_next():
    from monarch_nb.host.status_poll import StatusPoll

    class _HeldNet:
        def __init__(self):
            self.release = asyncio.Event()

        async def request(self, address, header, timeout=None):
            await self.release.wait()
            return SimpleNamespace(header={"actors": {}, "asked": True})

    async def run():
        net = _HeldNet()
        poll = StatusPoll(net, {"m/0": "tcp://p0"})
        asking = asyncio.ensure_future(poll.ask_all())
        await asyncio.sleep(0)
        assert poll.take() == {}  # a heartbeat while the procs are asked
        net.release.set()
        await asking
        return poll.take()

    assert asyncio.run(run())["m/0"][1]["asked"]


def test_an_agent_answers_the_hubs_ask_for_some_procs_leaving_out_those_gone():
    from monarch_nb.host.status_poll import StatusPoll

    net = _CountingNet()
    poll = StatusPoll(net, {"m/0": "tcp://p0", "m/1": "tcp://p1"})
    got = asyncio.run(poll.ask_now(["m/1", "m/7"]))  # m/7: exited before the ask came
    assert net.asked == ["tcp://p1"] and list(got) == ["m/1"] and got["m/1"][1]["asked"]
    assert poll.take() == {}  # answered to the hub, not again in a heartbeat


def test_health_keeps_statuses_wanted_for_a_while():
    health = Health("c", registry=_NO_AGENTS, net=_CountingNet(), meshes=None, hub_stats=dict)
    assert not health.wanted()
    health.want(60)
    assert health.wanted()
