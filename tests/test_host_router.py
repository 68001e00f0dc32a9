"""The host tier (issue 24 items 3-4): a call over a mesh that spans hosts leaves the
client as one message per host, each host's router (``host.router``) delivers it to
its actors and sends their replies back in batches, folding them with a reducer.

A fast tier checks the batching and folding alone (no process); the rest runs on real
procs over eight local host agents of four procs each (issue 24's size for CI), with
``MONARCH_NB_ROUTER=on``."""

from __future__ import annotations

import contextlib
import functools
import operator
import os
import signal
import sys
import threading
import time

import pytest

from conftest import cluster_processes, pids_alive, wait_until
from monarch_nb.actor import Actor, endpoint
from monarch_nb.client.cluster import Cluster
from monarch_nb.client.runtime import runtime
from monarch_nb.errors import ActorError, SupervisionError
from monarch_nb.host.folds import Folds
from monarch_nb.host.replies import Entry
from monarch_nb.host.router import RELAYED_FORGET_S, Casts, Relays, batch_frames
from monarch_nb.protocol import envelope, hub_ops, proc_ops, router_ops
from monarch_nb.wire import frames as wire_frames
from monarch_nb.wire import serialize, shm, sockets
from monarch_nb.wire.mailbox import Mailbox
from monarch_nb.wire.remote_error import unpack_exception

BOUND_S = 60.0
HOSTS, PER_HOST = 8, 4


# the fast tier: batching and folding, no process -------------------------------------
def _reply(rank: int, value, ok: bool = True) -> tuple[dict, bytes]:
    return {envelope.RANK: rank, envelope.OK: ok}, serialize.dumps(value)[0]


def test_replies_go_back_per_client_in_arrival_order_and_a_late_one_passes_through():
    casts = Casts()
    route = ("tcp://client:1", 7)
    casts.open(route, {0: "p/0", 1: "p/1", 2: "p/2"})
    for rank in (2, 0):
        casts.reply(route, *_reply(rank, rank * 10))
    first = casts.take()
    assert list(first) == [("tcp://client:1", None)]
    assert [e.header[envelope.RANK] for e in first[("tcp://client:1", None)]] == [2, 0]
    assert all(e.header[envelope.PORT] == 7 for e in first[("tcp://client:1", None)])
    assert casts.take() == {} and casts.waiting  # sent: not sent again; rank 1 still awaited
    casts.reply(route, *_reply(1, 10))
    casts.reply(route, *_reply(1, 11))  # a second value of rank 1 (a port's): passed on, not dropped
    assert [serialize.loads(e.body) for e in casts.take()[("tcp://client:1", None)]] == [10, 11]
    assert not casts.waiting


def test_a_batch_reaches_each_port_of_the_client_as_separate_replies():
    wire_frames.register_key("router-test", b"k" * 64)
    mailbox = Mailbox()
    got: list = []
    first = mailbox.open_port(lambda m: got.append((1, m.header[envelope.RANK], m.value())))
    second = mailbox.open_port(lambda m: got.append((2, m.header[envelope.RANK], m.value())))
    casts = Casts()
    casts.open(("me", first), {0: "p/0", 1: "p/1"})
    casts.open(("me", second), {0: "p/0"})
    casts.reply(("me", first), *_reply(1, "b"))
    casts.reply(("me", second), *_reply(0, "other call"))
    casts.reply(("me", first), *_reply(0, "a"))
    mailbox._dispatch(batch_frames("router-test", casts.take()[("me", None)]))
    assert got == [(1, 1, "b"), (2, 0, "other call"), (1, 0, "a")]


def test_a_router_starting_over_answers_each_awaited_rank_once_and_still_sends_what_it_folded():
    casts, folds = Casts(), Folds()
    casts.open(("me", 3), {0: "p/0", 1: "p/1", 2: "p/2"}, _pickled(operator.add))
    casts.open(("me", 4), {0: "p/0"})
    casts.reply(("me", 3), *_reply(0, 5))
    assert casts.abandon(SupervisionError("started over")) == 3 and not casts.waiting
    sent = _take_folded(casts, folds)[("me", None)]
    assert sorted((e.header[envelope.PORT], e.header[envelope.RANK], e.header[envelope.OK]) for e in sent) \
        == [(3, 0, True), (3, 1, False), (3, 2, False), (4, 0, False)]
    assert [serialize.loads(e.body) for e in sent if e.header[envelope.OK]] == [5]
    assert not [e for e in sent if e.header.get(proc_ops.DIED)]  # the actors live
    relays = Relays()
    relays.open(("me", 9), ["tcp://proc:1", "tcp://proc:2"], 10.0, now=0.0)
    relays.answered(1, 0)
    relays.give_up()
    assert relays.due(now=0.0) == [(("me", 9), ["tcp://proc:2"])] and not relays.waiting


def _pickled(reducer) -> bytes:
    """``reducer`` as a client sends it (``router_ops.REDUCE``)."""
    return serialize.dumps(reducer)[0]


def _take_folded(casts: Casts, folds: Folds) -> dict:
    """``casts``' replies once what is due is folded, as a router does (``host.folds``)."""
    for client, entry in folds.run(casts.take_folds()):
        casts.queue(client, entry)
    return casts.take()


def test_a_reducer_folds_the_values_that_succeeded_into_one_reply_and_failures_pass_through():
    casts, folds = Casts(), Folds()
    route = ("me", 3)
    casts.open(route, {0: "p/0", 1: "p/1", 2: "p/2", 3: "p/3"}, _pickled(operator.add))
    casts.reply(route, *_reply(0, 1))
    casts.reply(route, *_reply(2, 4))
    assert _take_folded(casts, folds) == {}  # folded values wait for the last rank of this host
    casts.reply(route, *_reply(1, "boom", ok=False))
    failed = _take_folded(casts, folds)[("me", None)]
    assert [e.header[envelope.RANK] for e in failed] == [1] and not failed[0].header[envelope.OK]
    casts.reply(route, *_reply(3, 8))
    (folded,) = _take_folded(casts, folds)[("me", None)]
    assert folded.header[router_ops.FOLDED] == [0, 2, 3] and folded.header[envelope.OK]
    assert serialize.loads(folded.body) == 13


def test_a_reducer_that_raises_comes_back_as_the_folds_error_not_the_ranks():
    def bad(a, b):
        raise ValueError("cannot fold")

    casts, folds = Casts(), Folds()
    casts.open(("me", 4), {0: "p/0", 1: "p/1"}, _pickled(bad))
    casts.reply(("me", 4), *_reply(0, 1))
    casts.reply(("me", 4), *_reply(1, 2))
    entries = _take_folded(casts, folds)[("me", None)]
    failure = next(e for e in entries if not e.header[envelope.OK])
    assert failure.header[envelope.RANK] == 1 and failure.header[router_ops.FOLD_FAILED]
    assert "cannot fold" in str(unpack_exception(serialize.loads(failure.body))[0])
    assert next(e for e in entries if e.header[envelope.OK]).header[router_ops.FOLDED] == [0]


class _ExitsWhenLoaded:
    def __reduce__(self):
        return sys.exit, ("a value that exits when unpickled",)


def test_a_reducer_or_a_value_that_exits_is_the_folds_error_and_the_router_goes_on():
    # SystemExit went past the router's handlers: its thread ended and its host was lost.
    def exits(a, b):
        sys.exit("the reducer gave up")

    casts, folds = Casts(), Folds()
    casts.open(("me", 7), {0: "p/0", 1: "p/1"}, _pickled(exits))
    casts.reply(("me", 7), *_reply(0, 1))
    casts.reply(("me", 7), *_reply(1, 2))
    casts.open(("me", 8), {0: "p/0", 1: "p/1"}, _pickled(operator.add))
    casts.reply(("me", 8), *_reply(0, 1))
    casts.reply(("me", 8), *_reply(1, _ExitsWhenLoaded()))
    failures = [e for e in _take_folded(casts, folds)[("me", None)] if not e.header[envelope.OK]]
    assert [(f.header[envelope.PORT], f.header[envelope.RANK], f.header[router_ops.FOLD_FAILED]) for f in failures] \
        == [(7, 1, True), (8, 1, True)]
    raised = [unpack_exception(serialize.loads(f.body))[0] for f in failures]
    assert [type(e) for e in raised] == [SystemExit, SystemExit]
    assert [str(e) for e in raised] == ["the reducer gave up", "a value that exits when unpickled"]


def test_a_folded_value_that_cannot_be_pickled_fails_every_rank_it_folds():
    # Only its first rank was answered: the client waited for the others until its timeout.
    casts, folds = Casts(), Folds()
    casts.open(("me", 6), {0: "p/0", 1: "p/1", 2: "p/2"}, _pickled(lambda a, b: threading.Lock()))
    for rank in range(3):
        casts.reply(("me", 6), *_reply(rank, rank))
    (failure,) = _take_folded(casts, folds)[("me", None)]
    assert not failure.header[envelope.OK] and failure.header[router_ops.FOLDED] == [0, 1, 2]
    assert failure.header[router_ops.FOLD_FAILED]
    assert "lock" in str(unpack_exception(serialize.loads(failure.body))[0])


def test_identical_replies_in_a_row_go_as_one_naming_their_ranks_and_nothing_overtakes():
    # A train step's None from every actor of a host: one reply for the client to take.
    casts = Casts()
    route = ("me", 8)
    casts.open(route, {r: f"p/{r}" for r in range(6)}, coalesce=True)
    for rank in (3, 0, 1):
        casts.reply(route, *_reply(rank, None))
    casts.reply(route, {envelope.RANK: 9, envelope.OK: True}, serialize.dumps("a port's value")[0])
    casts.reply(route, *_reply(2, None))  # after the port's value: must not join rank 3's reply before it
    casts.reply(route, *_reply(4, "boom", ok=False))
    casts.reply(route, *_reply(5, "boom", ok=False))  # a failure goes alone, whatever it is like
    entries = casts.take()[("me", None)]
    # (rank 2's names no other rank, but says it may be joined further on, at a relay)
    assert [(e.header[envelope.RANK], e.header.get(router_ops.SAME)) for e in entries] == [
        (3, [0, 1]), (9, None), (2, []), (4, None), (5, None)]
    assert serialize.loads(entries[0].body) is None


def test_a_relay_joins_alike_replies_of_several_hosts_and_counts_those_still_out():
    # As a client's relay: other hosts' routers send their batches here, each reply that
    # may be joined marked with SAME. Alike ones join across hosts; a port's value
    # between them is not overtaken; a failure goes alone.
    casts, none = Casts(), serialize.dumps(None)[0]
    route = ("me", 12)
    casts.expect_relayed(route, 7, now=0.0)
    casts.pass_on("me", Entry({envelope.RANK: 0, envelope.OK: True, envelope.PORT: 12, router_ops.SAME: [1, 2]},
                              memoryview(none)))
    casts.pass_on("me", Entry({envelope.RANK: 3, envelope.OK: True, envelope.PORT: 12, router_ops.SAME: []}, none))
    casts.pass_on("me", Entry({envelope.RANK: 9, envelope.OK: True, envelope.PORT: 15}, none))  # a port's value
    casts.pass_on("me", Entry({envelope.RANK: 4, envelope.OK: True, envelope.PORT: 12, router_ops.SAME: [5]}, none))
    assert casts.waiting  # rank 6 is still out
    casts.pass_on("me", Entry({envelope.RANK: 6, envelope.OK: False, envelope.PORT: 12}, serialize.dumps("boom")[0]))
    assert not casts.waiting
    entries = casts.take()[("me", None)]
    assert [(e.header[envelope.RANK], e.header.get(router_ops.SAME)) for e in entries] == [
        (0, [1, 2, 3]), (9, None), (4, [5]), (6, None)]
    # The relay's own host's replies join those passed on, and the other way round.
    casts.open(("me", 13), {0: "p/0"}, coalesce=True)
    casts.pass_on("me", Entry({envelope.RANK: 1, envelope.OK: True, envelope.PORT: 13, router_ops.SAME: []}, none))
    casts.reply(("me", 13), *_reply(0, None))
    assert [(e.header[envelope.RANK], e.header[router_ops.SAME]) for e in casts.take()[("me", None)]] == [(1, [0])]


def test_a_relay_waits_for_replies_of_a_host_lost_no_longer_than_their_time():
    casts = Casts()
    casts.expect_relayed(("me", 14), 2, now=100.0)
    casts.forget_relayed(100.0 + RELAYED_FORGET_S - 1)
    assert casts.waiting
    casts.forget_relayed(100.0 + RELAYED_FORGET_S)
    assert not casts.waiting


def test_replies_alike_stay_apart_unless_the_caller_asked_and_when_large_or_with_buffers():
    casts = Casts()
    casts.open(("me", 10), {0: "p/0", 1: "p/1"})  # a caller that takes each reply as it comes
    casts.open(("me", 11), {0: "p/0", 1: "p/1", 2: "p/2", 3: "p/3"}, coalesce=True)
    for rank in (0, 1):
        casts.reply(("me", 10), *_reply(rank, 1))
    large = serialize.dumps("x" * 2048)[0]
    for rank in (0, 1):
        casts.reply(("me", 11), {envelope.RANK: rank, envelope.OK: True}, large)
    for rank in (2, 3):
        casts.reply(("me", 11), {envelope.RANK: rank, envelope.OK: True}, b"", [b"a buffer"])
    assert [router_ops.SAME in e.header for e in casts.take()[("me", None)]] == [False] * 6


def test_a_proc_gone_fails_its_pending_ranks_as_dead_and_only_those():
    casts = Casts()
    casts.open(("me", 5), {0: "p/0", 1: "p/1"})
    casts.proc_gone(lambda proc: "proc p/1 exited" if proc == "p/1" else None)
    (entry,) = casts.take()[("me", None)]
    assert entry.header[envelope.RANK] == 1 and entry.header[proc_ops.DIED]
    exc, _ = unpack_exception(serialize.loads(entry.body))
    assert isinstance(exc, SupervisionError) and "p/1 exited" in str(exc)
    casts.reply(("me", 5), *_reply(1, "too late"))  # answered already: passed on, the client drops it
    casts.reply(("me", 5), *_reply(0, "ok"))
    assert not casts.waiting


def test_an_interrupt_passed_on_is_answered_once_all_procs_answered_naming_those_that_did_not():
    relays = Relays()
    number = relays.open(("client", 7), ["tcp://p0", "tcp://p1", "tcp://p2"], wait_s=5.0, now=0.0)
    relays.answered(number, 0)
    relays.answered(number, 2, reached=False)  # its send failed
    assert relays.due(1.0) == []  # p1 has not answered, and there is time left
    relays.answered(number, 1)
    assert relays.due(1.0) == [(("client", 7), ["tcp://p2"])]
    assert not relays.waiting and relays.due(1.0) == []  # answered once
    late = relays.open(("client", 8), ["tcp://p0", "tcp://p1"], wait_s=5.0, now=0.0)
    relays.answered(late, 1)
    relays.answered(number, 0)  # an answer to a relay already answered: nothing
    assert relays.due(4.9) == [] and relays.due(5.0) == [(("client", 8), ["tcp://p0"])]


class _FakeHub:
    def __init__(self, hosts: dict[str, str], machines: dict[str, str] | None = None):
        self.hosts, self.procs, self.asked = hosts, [], 0
        self.machines = machines or {h: f"machine-{h}" for h in hosts}  # host id -> hostname

    def request(self, op, timeout, **fields):
        self.asked += 1
        self.of = fields.get(hub_ops.INFO_OF)  # the meshes asked about
        return {"hosts": [{"host_id": h, router_ops.ROUTER_ADDRESS: r, "hostname": self.machines[h]}
                          for h, r in self.hosts.items()],
                "proc_meshes": {"pm": {"procs": self.procs}},
                "actor_meshes": {"am": {"proc_mesh": "pm", "proc_ranks": list(range(len(self.procs)))}}}


class _FakeMesh:
    def __init__(self, hub: _FakeHub, addresses: list[str]):
        self._cluster_id, self._key, self._addresses, self._hub = "c", "am", addresses, lambda: hub


def test_by_default_large_meshes_on_two_machines_are_routed_and_local_host_agents_are_not(monkeypatch):
    from monarch_nb.client.host_routes import DEFAULT_THRESHOLD, HostRoutes, may_route

    monkeypatch.delenv(router_ops.ROUTER_ENV, raising=False)
    n = DEFAULT_THRESHOLD
    addresses = [f"tcp://a{i}" for i in range(n)]
    procs = [{"host_id": f"h{i % 2}", "proc_id": f"p/{i}"} for i in range(n)]
    apart = _FakeHub({"h0": "tcp://r0", "h1": "tcp://r1"})
    together = _FakeHub({"h0": "tcp://r0", "h1": "tcp://r1"}, machines={"h0": "box", "h1": "box"})
    apart.procs = together.procs = procs
    assert HostRoutes({}).routes(_FakeMesh(apart, addresses))["tcp://a1"] == ("tcp://r1", 1, "p/1")
    known = HostRoutes({})
    assert known.routes(_FakeMesh(together, addresses)) is None  # its routers would share our cores
    assert HostRoutes({}).routes(_FakeMesh(apart, addresses[:-1])) is None and apart.asked == 1  # too small
    assert may_route(n, 2, lambda: 2) and not may_route(n, 2, lambda: 1) and not may_route(n - 1, 2, lambda: 2)
    monkeypatch.setenv(router_ops.ROUTER_ENV, router_ops.ROUTER_ON)  # on: local host agents too
    assert known.routes(_FakeMesh(together, addresses)) is not None and together.asked == 1  # learnt once
    assert may_route(2, 2, lambda: pytest.fail("machines need not be counted"))
    assert not may_route(2, 1, lambda: 2)  # one host: never


def test_a_meshs_routes_are_learnt_once_and_replaced_not_piled_up_when_its_addresses_change(monkeypatch):
    from monarch_nb.client.host_routes import HostRoutes

    monkeypatch.setenv(router_ops.ROUTER_ENV, router_ops.ROUTER_ON)
    hub = _FakeHub({"h0": "tcp://r0", "h1": "tcp://r1"})
    hub.procs = [{"host_id": "h0", "proc_id": "p/0"}, {"host_id": "h1", "proc_id": "p/1"}]
    routes = HostRoutes(local_planes={})
    first = routes.routes(_FakeMesh(hub, ["tcp://a0", "tcp://a1"]))
    assert first == {"tcp://a0": ("tcp://r0", 0, "p/0"), "tcp://a1": ("tcp://r1", 1, "p/1")}
    assert routes.routes(_FakeMesh(hub, ["tcp://a0", "tcp://a1"])) == first and hub.asked == 1
    assert hub.of == {"actor_meshes": ["am"]}  # that mesh only, not the whole registry
    for restart in range(3):  # a restart gives the mesh new addresses: asked again, the old table goes
        hub.procs = [{"host_id": "h0", "proc_id": f"p/0.{restart}"}, {"host_id": "h1", "proc_id": "p/1"}]
        table = routes.routes(_FakeMesh(hub, [f"tcp://b{restart}", "tcp://a1"]))
        assert table[f"tcp://b{restart}"] == ("tcp://r0", 0, f"p/0.{restart}")
    assert hub.asked == 4 and len(routes._tables) == 1


# real procs over several host agents ---------------------------------------------------
class Recorder(Actor):
    def __init__(self):
        self.seen: list = []

    @endpoint
    def record(self, caller: str, i: int) -> int:
        self.seen.append((caller, i))
        return i

    @endpoint
    def seen_by(self, caller: str) -> list:
        return [i for c, i in self.seen if c == caller]

    @endpoint
    def bump(self, array) -> tuple:
        """Add 1 to the array received: a value of its own, whoever else got the same call."""
        array[1:] += 1
        return int(array[1]), int(array.sum())

    @endpoint
    def value(self, x: int) -> int:
        from monarch_nb.actor import current_rank

        return x * 100 + current_rank().rank

    @endpoint
    def one(self) -> int:
        return 1

    @endpoint
    def same(self, value):
        return value

    @endpoint
    def loads_once(self):
        return _LoadsOnce()

    @endpoint
    def array_after(self, gate_path: str, n: int):
        """``n`` float64 zeros, once the test removes the file (each rank says it began
        with a file of its own beside it): a reply with an out-of-band buffer, which
        leaves without a copy."""
        import time

        import numpy as np

        from monarch_nb.actor import current_rank

        open(f"{gate_path}.{current_rank().rank}", "w").close()
        while os.path.exists(gate_path):
            time.sleep(0.05)
        return np.zeros(n)

    @endpoint
    def stream(self, port, n: int) -> None:
        from monarch_nb.actor import current_rank

        for i in range(n):
            port.send((current_rank().rank, i))

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def stream_until(self, port, stop_path: str) -> int:
        """Send 0, 1, 2, ... through ``port``, one every 20 ms, until the test makes ``stop_path``."""
        import time

        i = 0
        while not os.path.exists(stop_path):
            port.send(i)
            i += 1
            time.sleep(0.02)
        return i

    @endpoint
    def blob(self, size: int) -> bytes:
        return b"x" * size

    @endpoint
    def fail_on(self, rank: int) -> int:
        from monarch_nb.actor import current_rank

        if current_rank().rank == rank:
            raise ValueError(f"rank {rank} refuses")
        return 1

    @endpoint
    def record_after(self, gate_path: str, caller: str, i: int) -> None:
        """:meth:`record` once the test removes the file."""
        import time

        while os.path.exists(gate_path):
            time.sleep(0.05)
        self.seen.append((caller, i))

    @endpoint
    def hold(self, gate_path: str) -> str:
        # Waits until the test removes the file (it kills this proc first).
        import time

        while os.path.exists(gate_path):
            time.sleep(0.05)
        return "released"


@pytest.fixture(scope="module")
def routed():
    before = os.environ.get(router_ops.ROUTER_ENV)
    os.environ[router_ops.ROUTER_ENV] = router_ops.ROUTER_ON
    c = Cluster.start_ephemeral(hosts=HOSTS)
    try:
        procs = c.host_mesh().spawn_procs(per_host={"gpus": PER_HOST}, name="routed")
        yield c, procs, procs.spawn("rec", Recorder)
    finally:
        c.stop()
        if before is None:
            os.environ.pop(router_ops.ROUTER_ENV, None)
        else:
            os.environ[router_ops.ROUTER_ENV] = before
    assert wait_until(lambda: not cluster_processes(c.path), 15), cluster_processes(c.path)


class _Received:
    """Counts the messages this client's mailbox receives (a batch counts once)."""

    def __init__(self):
        self.count = 0
        self._mailbox = runtime().mailbox

    def __enter__(self):
        dispatch = Mailbox._dispatch.__get__(self._mailbox)

        def counted(frames):
            self.count += 1
            dispatch(frames)

        self._mailbox._dispatch = counted
        return self

    def __exit__(self, *exc):
        del self._mailbox._dispatch


def test_the_client_and_the_actors_of_a_routed_mesh_do_not_connect_to_each_other(routed):
    # Calls and replies go through the routers: the client holds a connection per host,
    # not one per actor (spawned here, and picked again from actor_meshes).
    import psutil

    cluster, _, _ = routed
    procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 2}, name="routed_fds")
    try:
        mesh = procs.spawn("rec", Recorder)
        assert mesh.one.call().get(timeout=BOUND_S).values() == [1] * (HOSTS * 2)
        picked = cluster.actor_meshes["routed_fds/rec"]
        assert picked.one.call().get(timeout=BOUND_S).values() == [1] * (HOSTS * 2)
        inbox_port = int(runtime().mailbox.address.rpartition(":")[2])
        actor_ports = {int(a.rpartition(":")[2]) for a in mesh._addresses}
        assert not [c for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr.port in actor_ports]
        for pid in mesh.pid.call().get(timeout=BOUND_S).values():
            assert not [c for c in psutil.Process(pid).net_connections("tcp")
                        if c.raddr and c.raddr.port == inbox_port], f"actor pid {pid} connected to the client"
    finally:
        procs.stop()


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def _connections_to(pid: int, port: int) -> int:
    import psutil

    return sum(1 for c in psutil.Process(pid).net_connections("tcp")
               if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def test_a_routed_meshs_actors_and_routers_connect_while_it_is_spawned_not_on_its_first_call(routed):
    # Each new actor connects to its host's router and tells it where it is, so the
    # router connects back while the constructors run: the first call waited for every
    # handshake (~250 ms over 32 hosts of 8).
    cluster, procs, _ = routed
    hosts = {h["host_id"]: h for h in cluster.info()["hosts"]}
    before = {p["pid"]: _connections_to(p["pid"], _port(hosts[p["host_id"]]["router"])) for p in procs._procs}
    mesh = procs.spawn("announced", Recorder)
    try:
        def connected() -> bool:  # (an actor's replies take a connection of its own thread)
            return all(_connections_to(p["pid"], _port(hosts[p["host_id"]]["router"])) > before[p["pid"]]
                       and _connections_to(hosts[p["host_id"]]["pid"], _port(address)) == 1
                       for p, address in zip(procs._procs, mesh._addresses))

        assert wait_until(connected, 30), "a new actor and its router did not connect before its first call"
        assert mesh.one.call().get(timeout=BOUND_S).values() == [1] * (HOSTS * PER_HOST)
    finally:
        mesh.stop()


def test_what_a_call_asks_the_hub_of_its_mesh_holds_that_mesh_only_not_the_whole_cluster(routed):
    # A mesh's first routed call, a spawn's machine count and an interrupt ask the hub of
    # their own meshes: the whole registry was O(every proc of the cluster) each time.
    cluster, procs, mesh = routed
    other = cluster.host_mesh().spawn_procs(per_host={"gpus": 1}, name="bystander")
    try:
        hub = mesh._hub()
        everything = hub.request(hub_ops.INFO, timeout=BOUND_S)
        assert {"routed", "bystander"} <= set(everything["proc_meshes"])
        mine = hub.request(hub_ops.INFO, timeout=BOUND_S, **{hub_ops.INFO_OF: {"actor_meshes": [mesh._key]}})
        assert list(mine["actor_meshes"]) == [mesh._key] and list(mine["proc_meshes"]) == ["routed"]
        assert mine["actor_meshes"][mesh._key] == everything["actor_meshes"][mesh._key]
        assert len(mine["hosts"]) == HOSTS
        with pytest.raises(ValueError, match="must be a dict"):  # refused, and the hub serves on
            hub.request(hub_ops.INFO, timeout=BOUND_S, **{hub_ops.INFO_OF: ["routed"]})
        assert mesh.one.call().get(timeout=BOUND_S).values() == [1] * (HOSTS * PER_HOST)
    finally:
        other.stop()


def test_each_new_actor_of_a_direct_mesh_tells_the_spawning_client_where_it_is_during_the_spawn(monkeypatch):
    # The client connects to each as it hears, while the other constructors run (its
    # connects after the spawn held up a first call to 256 actors ~100 ms).
    monkeypatch.setenv(router_ops.ROUTER_ENV, router_ops.ROUTER_OFF)
    cluster = Cluster.start_ephemeral(hosts=2)
    try:
        procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 2}, name="direct")
        mailbox = runtime().mailbox
        heard: list[str] = []
        deliver = Mailbox._deliver.__get__(mailbox)

        def recording(message, *args, **kwargs):
            if message.header.get(envelope.OP) == proc_ops.ACTOR_BOUND:
                heard.append(message.header[proc_ops.ADDRESS])
            return deliver(message, *args, **kwargs)

        with monkeypatch.context() as patched:
            patched.setattr(mailbox, "_deliver", recording)
            mesh = procs.spawn("told", Recorder)
        assert sorted(heard) == sorted(mesh._addresses)
        assert mesh.one.call().get(timeout=BOUND_S).values() == [1] * 4
    finally:
        cluster.stop()
    assert wait_until(lambda: not cluster_processes(cluster.path), 15), cluster_processes(cluster.path)


@pytest.mark.parametrize("relay", [router_ops.ROUTER_OFF, router_ops.ROUTER_ON])
def test_a_clients_port_passed_to_routed_actors_sends_back_through_the_routers(routed, relay, monkeypatch):
    # A Channel's port in a routed call's or broadcast's arguments: the actors send its
    # values to their router, which forwards them (through the relay, with relays on);
    # no actor connects to the client.
    import psutil

    monkeypatch.setenv(router_ops.RELAY_ENV, relay)

    from monarch_nb.actor import Channel

    cluster, _, _ = routed
    procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 2}, name="routed_ports")
    try:
        mesh = procs.spawn("rec", Recorder)
        n, actors = 20, HOSTS * 2
        for send in (lambda port: mesh.stream.broadcast(port, n),
                     lambda port: mesh.stream.call(port, n).get(timeout=BOUND_S)):
            port, receiver = Channel.open()
            send(port)
            got = [receiver.recv().get(timeout=BOUND_S) for _ in range(n * actors)]
            for rank in range(actors):
                assert [i for r, i in got if r == rank] == list(range(n)), f"rank {rank}'s values out of order"
        inbox_port = int(runtime().mailbox.address.rpartition(":")[2])
        for pid in mesh.pid.call().get(timeout=BOUND_S).values():
            assert not [c for c in psutil.Process(pid).net_connections("tcp")
                        if c.raddr and c.raddr.port == inbox_port], f"actor pid {pid} connected to the client"
    finally:
        procs.stop()


def test_routed_calls_give_what_direct_calls_give(routed, monkeypatch):
    _, _, mesh = routed
    through_routers = mesh.value.call(3).get(timeout=BOUND_S)
    monkeypatch.setenv(router_ops.ROUTER_ENV, router_ops.ROUTER_OFF)
    direct = mesh.value.call(3).get(timeout=BOUND_S)
    assert through_routers.extent == direct.extent
    assert list(through_routers.values()) == list(direct.values()) == [300 + r for r in range(HOSTS * PER_HOST)]


def test_alike_replies_through_the_routers_give_each_rank_its_value_and_mutable_ones_apart(routed):
    # Routers send a host's identical replies as one (router_ops.SAME); a value that can
    # change must still be each rank's own object, as if every reply had come.
    _, _, mesh = routed
    n = HOSTS * PER_HOST
    assert list(mesh.same.call(None).get(timeout=BOUND_S).values()) == [None] * n
    lists = list(mesh.same.call([1, {"k": 2}]).get(timeout=BOUND_S).values())
    assert lists == [[1, {"k": 2}]] * n
    lists[0].append("mine")
    lists[1][1]["k"] = 3
    assert lists[2] == [1, {"k": 2}] and len({id(v) for v in lists}) == n


_loaded: list = []


def _load_once() -> list:
    # In this client: the first reply unpickles, every later one raises.
    if _loaded:
        raise ValueError("this value unpickles only once")
    _loaded.append(1)
    return _loaded


class _LoadsOnce:
    def __reduce__(self):
        return (_load_once, ())


def test_a_value_that_unpickles_once_fails_the_other_ranks_instead_of_hanging_the_call(routed):
    # A reply that SAME names for several ranks is unpickled again for each (its value is
    # a list); one that fails there is that rank's failure, as it is for a reply of its own.
    _, _, mesh = routed
    _loaded.clear()
    with pytest.raises(ActorError, match="unpickles only once") as raised:
        mesh.loads_once.call().get(timeout=BOUND_S)
    assert f"{HOSTS * PER_HOST - 1} of {HOSTS * PER_HOST}" in str(raised.value)
    assert mesh.one.reduce(operator.add).get(timeout=BOUND_S) == HOSTS * PER_HOST


def test_a_client_gone_with_large_replies_pending_holds_no_router_up(routed, tmp_path):
    # A router serves every client of its host: a large reply to a client that died must
    # not keep it from passing on the others' calls (it waited up to a minute per reply
    # for the dead client to read, and every call through that host with it).
    import subprocess
    import sys

    c, _, mesh = routed
    gate = tmp_path / "gate"
    gate.touch()
    other = subprocess.Popen(
        [sys.executable, "-c", "import sys, time, monarch_nb\n"
         f"mesh = monarch_nb.connect({c.name!r}).actor_meshes['routed/rec']\n"
         f"pending = mesh.array_after.call({str(gate)!r}, 60_000)\n"  # 480 KB replies, once the gate opens
         "print('sent', flush=True)\n"
         "time.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "sent"
        n = HOSTS * PER_HOST
        assert wait_until(lambda: all((tmp_path / f"gate.{r}").exists() for r in range(n)), BOUND_S)
    finally:
        other.kill()
        other.wait()
    gate.unlink()  # its replies now go to a client that is gone, ahead of this call's
    assert mesh.one.reduce(operator.add).get(timeout=30) == HOSTS * PER_HOST


def test_a_large_argument_reaches_every_actor_of_a_host_as_a_value_of_its_own(routed):
    # The router writes it to shared memory once for its host's actors (wire.shm.sharing),
    # and each maps it private: one actor's writes are not another's.
    import numpy as np

    _, _, mesh = routed
    array = np.zeros(2 * shm.MIN_BYTES // 8, np.int64)
    got = mesh.bump.call(array).get(timeout=BOUND_S).values()
    assert got == [(1, array.size - 1)] * (HOSTS * PER_HOST)
    assert not array.any()  # the caller's own array is untouched too
    assert wait_until(lambda: shm._segments(routed[0]._info["cluster_id"]) == [], 10)


def test_a_sum_reducer_folds_at_each_router_one_message_per_host(routed):
    _, _, mesh = routed
    mesh.one.call().get(timeout=BOUND_S)  # the route table is learnt (one hub request) before counting
    with _Received() as received:
        total = mesh.one.reduce(operator.add).get(timeout=BOUND_S)
    assert total == HOSTS * PER_HOST
    assert received.count <= HOSTS, received.count
    assert mesh.value.reduce(max, 1).get(timeout=BOUND_S) == 100 + HOSTS * PER_HOST - 1
    with _Received() as received:
        assert len(mesh.one.call().get(timeout=BOUND_S)) == HOSTS * PER_HOST
    # Streamed: a batch holds what its router had when its socket was free (1 or 2 here).
    assert received.count <= HOSTS * PER_HOST


def test_an_accumulator_with_a_reducer_folds_at_the_routers(routed):
    from monarch_nb.actor import Accumulator

    _, _, mesh = routed
    mesh.one.call().get(timeout=BOUND_S)
    with _Received() as received:
        assert Accumulator(mesh.one, 100, operator.add, reducer=operator.add).accumulate().get(
            timeout=BOUND_S) == 100 + HOSTS * PER_HOST
    assert received.count <= HOSTS, received.count
    assert Accumulator(mesh.one, 100, operator.add).accumulate().get(timeout=BOUND_S) == 100 + HOSTS * PER_HOST
    with pytest.raises(TypeError, match="reducer is a function of two replies"):
        Accumulator(mesh.one, 0, operator.add, reducer=3)


def test_a_failed_rank_fails_a_routed_call_and_a_reduce_as_a_direct_call_does(routed):
    _, _, mesh = routed
    with pytest.raises(ActorError, match="rank 4 refuses"):
        mesh.fail_on.call(4).get(timeout=BOUND_S)
    with pytest.raises(ActorError, match="rank 1 refuses"):
        mesh.fail_on.reduce(operator.add, 1).get(timeout=BOUND_S)


def _refuse_to_load():
    raise ImportError("this reducer's module is not importable here")


class _UnloadableReducer:
    """A reducer the routers cannot unpickle (as one whose module only the client has)."""

    def __call__(self, a, b):
        return a + b

    def __reduce__(self):
        return (_refuse_to_load, ())


def test_replies_of_every_size_pass_through_the_routers(routed):
    # 64 KiB to 1 MiB go as frames of their own (not shared memory): a router passing
    # one on died on it (pyzmq can't track a received frame), and every later call hung.
    _, _, mesh = routed
    for size in (100, 65536, 200_000, (1 << 20) - 1, 1 << 20, 3 << 20):
        assert [len(v) for v in mesh.blob.call(size).get(timeout=BOUND_S).values()] == [size] * (HOSTS * PER_HOST)
    assert mesh.one.reduce(operator.add).get(timeout=BOUND_S) == HOSTS * PER_HOST


def test_a_router_whose_thread_keeps_failing_starts_over_a_few_times_then_says_so_and_ends():
    from monarch_nb.host.router import RESTARTS_MAX, Router
    from monarch_nb.wire import frames as wire_frames

    wire_frames.register_key("router-fails", b"r" * 32)
    failures: list = []
    router = Router("router-fails", "h0", lambda proc: None, on_failure=failures.append)

    def broken_flush() -> None:
        raise RuntimeError("a bug in the router")

    router._flush = broken_flush
    # An interrupt it passed on, still waiting on a proc: answered as it gives up (its
    # client waited out its timeout, up to 10 s, for an answer that never came).
    client, client_address = sockets.bind_inbox()
    router.relays.open((client_address, 5), ["tcp://127.0.0.1:1"], 10.0, time.monotonic())
    router.start()
    assert wait_until(lambda: failures, 10) and str(failures[0]) == "a bug in the router"
    router._thread.join(10)
    assert not router._thread.is_alive() and router.restarts == RESTARTS_MAX
    router.stop(10)  # its folds' thread too
    assert client.poll(10_000)
    answer = wire_frames.decode(sockets.recv_frames(client), None).header
    assert answer[envelope.PORT] == 5 and answer[router_ops.MISSED] == ["tcp://127.0.0.1:1"]
    client.close(0)


def test_a_router_that_cannot_make_a_socket_fails_that_peer_only_and_goes_on(capfd):
    # Out of files (EMFILE, a zmq error rather than a peer's refusal): once, it ended the
    # router's thread, and its agent left: a host lost for one socket.
    import errno

    import zmq

    from monarch_nb.host.router import Router

    wire_frames.register_key("router-emfile", b"e" * 32)
    router = Router("router-emfile", "h0", lambda proc: None)
    sent: list = []

    def send(address, frames, wait=True):
        if address in ("tcp://actor:2", "tcp://client:9"):
            raise zmq.ZMQError(errno.EMFILE)
        sent.append(address)

    router.outbox.send = send
    call = {envelope.KIND: proc_ops.CALL, proc_ops.ENDPOINT: "one", envelope.REPLY: "tcp://client:1",
            envelope.PORT: 5}
    cast = {envelope.OP: router_ops.CAST, router_ops.CALL: call,
            router_ops.TARGETS: [["tcp://actor:1", 0, "p/0"], ["tcp://actor:2", 1, "p/1"]]}
    router._cast(wire_frames.decode(wire_frames.encode("router-emfile", cast, serialize.dumps(((), {}))[0]), None))
    assert sent == ["tcp://actor:1"]
    failed = router.casts.take()[("tcp://client:1", None)]
    assert [(e.header[envelope.RANK], e.header[envelope.OK], e.header.get(proc_ops.DIED)) for e in failed] \
        == [(1, False, None)]
    assert "could not send this call to its actor (ZMQError: Too many open files); it was not run" \
        in str(unpack_exception(serialize.loads(failed[0].body)))
    router.casts.queue(("tcp://client:9", None), failed[0])
    router._flush()  # a client it can't reach: that client's replies dropped, saying so
    assert "replies to tcp://client:9 dropped: Too many open files" in capfd.readouterr().err
    router.stop(10)


def test_a_router_that_faults_fails_what_it_carries_once_starts_over_and_its_host_lives_on(routed, tmp_path):
    # Exactly once under a router restart (issue 24): the calls in flight through the
    # faulted router fail at once (ActorError: the actor lives), the others go on, none is run twice (a replay sent
    # after it started over is still refused), and the same router carries the next
    # calls: no host is lost, no proc restarted.
    from monarch_nb.ft import inject_fault

    c, procs, mesh = routed
    info = c.info()
    agents, pids = {h["host_id"]: h["pid"] for h in info["hosts"]}, procs.pids
    victim = PER_HOST  # hosts=1, gpus=0
    router = next(h[router_ops.ROUTER_ADDRESS] for h in info["hosts"] if h["host_id"] == procs._procs[victim]["host_id"])
    raw = {envelope.OP: router_ops.CAST, router_ops.TARGETS: [[mesh._addresses[victim], victim,
                                                                info["proc_meshes"]["routed"]["procs"][victim]["proc_id"]]],
           router_ops.CALL: {envelope.KIND: proc_ops.CALL, proc_ops.ENDPOINT: "record",
                             proc_ops.ORIGIN: runtime().origin()}}
    frames = wire_frames.encode(mesh._cluster_id, raw, serialize.dumps((("raw", 1), {}))[0])
    outbox = runtime().mailbox.outbox
    gate = tmp_path / "gate"
    gate.touch()
    arriving = mesh.record_after.stream(str(gate), "faulted", 0)
    outbox.send(router, frames)  # (the same socket as the call's and the fault's: in order)
    assert inject_fault(mesh, "router", ranks=[victim]) == [victim]
    failed = [next(arriving) for _ in range(PER_HOST)]  # while every rank still waits on the gate
    for future in failed:
        with pytest.raises(ActorError, match=f"SupervisionError: the router of host {procs._procs[victim]['host_id']} failed "
                                                   "\\(InjectedRouterFault.*started over.*may or may not have run"):
            future.get()
    outbox.send(router, frames)  # a replay, after the restart: refused
    outbox.send(router, wire_frames.encode(mesh._cluster_id, raw, serialize.dumps((("raw", 2), {}))[0]))
    gate.unlink()
    assert [f.get() for f in arriving] == [None] * (HOSTS * PER_HOST - PER_HOST)
    # Each rank ran the call once: the faulted host's too (delivered before the fault;
    # its callers were told it may have run).
    assert mesh.seen_by.call("faulted").get(timeout=BOUND_S).values() == [[0]] * (HOSTS * PER_HOST)
    assert mesh.seen_by.call("raw").get(timeout=BOUND_S).values()[victim] == [1, 2]
    assert mesh.one.reduce(operator.add).get(timeout=BOUND_S) == HOSTS * PER_HOST
    assert {h["host_id"]: h["pid"] for h in c.info()["hosts"]} == agents and procs.pids == pids
    assert {h["state"] for h in c.health()["hosts"]} == {"healthy"}


def test_a_reducer_the_routers_cannot_load_or_the_client_cannot_pickle_folds_in_the_client(routed):
    # As a direct call's: the routers pass the values on (they hung the call once).
    _, _, mesh = routed
    n = HOSTS * PER_HOST
    assert mesh.one.reduce(_UnloadableReducer()).get(timeout=BOUND_S) == n
    lock = threading.Lock()

    def unpicklable(a, b):
        with lock:
            return a + b

    assert mesh.one.reduce(unpicklable).get(timeout=BOUND_S) == n
    assert mesh.one.reduce(operator.add).get(timeout=BOUND_S) == n  # the routers carry on


def test_what_a_reducer_raises_at_the_routers_is_what_the_reduce_raises_as_when_called_directly(
        routed, monkeypatch):
    _, _, mesh = routed

    def refuses(a, b):
        raise ValueError("cannot fold these")

    def lock_of(a, b):
        return threading.Lock()  # a fold that can't travel from a router

    for setting in (router_ops.ROUTER_ON, router_ops.ROUTER_OFF):
        monkeypatch.setenv(router_ops.ROUTER_ENV, setting)
        with pytest.raises(ValueError, match="cannot fold these"):
            mesh.one.reduce(refuses).get(timeout=BOUND_S)
        with pytest.raises(TypeError, match="unsupported operand"):
            mesh.same.reduce(operator.add, None).get(timeout=BOUND_S)
        assert mesh.value.reduce(max, 1).get(timeout=BOUND_S) == 100 + HOSTS * PER_HOST - 1
    monkeypatch.setenv(router_ops.ROUTER_ENV, router_ops.ROUTER_OFF)
    assert type(mesh.one.reduce(lock_of).get(timeout=BOUND_S)) is type(threading.Lock())
    monkeypatch.setenv(router_ops.ROUTER_ENV, router_ops.ROUTER_ON)
    with pytest.raises(Exception, match="lock") as raised:
        mesh.one.reduce(lock_of).get(timeout=BOUND_S)
    assert not isinstance(raised.value, ActorError)  # the fold's error, not the ranks'


def test_a_reducer_that_exits_fails_the_reduce_and_every_host_lives_on(routed, monkeypatch):
    # Through the routers it ended every host's router thread, and so every host; called
    # directly, the client's fold left the call waiting for ever.
    _, _, mesh = routed

    def exits(a, b):
        sys.exit("the reducer gave up")

    for setting in (router_ops.ROUTER_ON, router_ops.ROUTER_OFF):
        monkeypatch.setenv(router_ops.ROUTER_ENV, setting)
        with pytest.raises(SystemExit, match="the reducer gave up"):
            mesh.one.reduce(exits).get(timeout=BOUND_S)
        assert mesh.one.reduce(operator.add).get(timeout=BOUND_S) == HOSTS * PER_HOST


def test_a_slow_reducer_holds_up_its_own_reduce_and_nothing_else_on_its_hosts(routed, tmp_path):
    # It ran on the router's thread: every call, reply and port value through those hosts
    # waited for it (a sum of large tensors, a reducer that blocks).
    _, _, mesh = routed
    gate = str(tmp_path / "gate")
    open(gate, "w").close()

    def waits(a, b):
        while os.path.exists(gate):
            time.sleep(0.02)
        return a + b

    folding = mesh.one.reduce(waits)
    assert mesh.value.call(1).get(timeout=BOUND_S).values() == [100 + r for r in range(HOSTS * PER_HOST)]
    assert not folding.done()
    os.unlink(gate)
    assert folding.get(timeout=BOUND_S) == HOSTS * PER_HOST


@pytest.mark.parametrize("relay", [router_ops.ROUTER_OFF, router_ops.ROUTER_ON])
def test_each_callers_calls_reach_each_actor_in_the_order_sent(routed, relay, monkeypatch):
    monkeypatch.setenv(router_ops.RELAY_ENV, relay)
    _, _, mesh = routed
    n = 40

    def caller(name: str) -> None:
        for i in range(n):  # broadcasts, whole-mesh calls and one-actor calls, interleaved
            if i % 3 == 0:
                mesh.record.broadcast(name, i)
            elif i % 3 == 1:
                mesh.record.call(name, i)
            else:
                mesh.slice(hosts=1, gpus=0).record.call_one(name, i)
        mesh.record.call(name, n).get(timeout=BOUND_S)  # after every earlier message of this thread
    names = [f"{relay}-t{k}" for k in range(2)]  # (the actors keep what the other parameter's run recorded)
    threads = [threading.Thread(target=caller, args=(name,)) for name in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in names:
        seen = mesh.seen_by.call(name).get(timeout=BOUND_S)
        for rank, got in enumerate(seen.values()):
            expected = [i for i in range(n) if i % 3 != 2 or rank == PER_HOST] + [n]  # rank 2: hosts=1, gpus=0
            assert got == expected, (name, rank, got)  # each once, in order


def test_frames_to_a_router_that_are_badly_signed_or_replayed_are_dropped(routed, tmp_path):
    c, procs, mesh = routed
    info = c.info()
    target_host = info["hosts"][0]
    router = target_host[router_ops.ROUTER_ADDRESS]
    address = mesh._addresses[0]
    proc_id = info["proc_meshes"]["routed"]["procs"][0]["proc_id"]
    assert mesh.seen_by.call("raw").get(timeout=BOUND_S).values()[0] == []
    cast = {envelope.OP: router_ops.CAST, router_ops.TARGETS: [[address, 0, proc_id]],
            router_ops.CALL: {envelope.KIND: proc_ops.CALL, proc_ops.ENDPOINT: "record",
                              proc_ops.ORIGIN: runtime().origin()}}
    frames = wire_frames.encode(mesh._cluster_id, cast, serialize.dumps((("raw", 1), {}))[0])
    forged = list(frames)
    forged[0] = bytes(frames[0])[:5] + bytes([bytes(frames[0])[5] ^ 1]) + bytes(frames[0])[6:]
    outbox = runtime().mailbox.outbox
    outbox.send(router, forged)  # a bad signature: dropped
    outbox.send(router, frames)  # delivered once...
    outbox.send(router, frames)  # ...and this replay dropped
    second = wire_frames.encode(mesh._cluster_id, cast, serialize.dumps((("raw", 2), {}))[0])
    outbox.send(router, second)
    # Sent after the raw casts on the same socket, through the same router: it sees them all.
    assert mesh.seen_by.call("raw").get(timeout=BOUND_S).values()[0] == [1, 2]
    dropped = lambda: next(h for h in c.info()["hosts"] if h["host_id"] == target_host["host_id"])["dropped_frames"]  # noqa: E731
    assert wait_until(lambda: dropped() >= target_host["dropped_frames"] + 2, 10), dropped()


def test_ctrl_c_interrupts_a_routed_call_where_it_runs_and_refuses_the_queued_one(routed, tmp_path):
    # What Ctrl-C in a notebook does to the cell's calls (client.in_flight), through routers.
    import psutil

    from monarch_nb.client import in_flight

    _, procs, mesh = routed
    rt = runtime()
    gate = tmp_path / "gate"
    gate.touch()  # never removed: only the interrupt ends the running call
    rt.cell, before = "routed-cell", rt.cell
    try:
        running, queued = mesh.hold.call(str(gate)), mesh.hold.call(str(gate))
        assert in_flight.interrupt(rt.in_flight.of_cell("routed-cell")) == [f"rec.hold (ranks 0-{HOSTS * PER_HOST - 1})"]
        for call in (running, queued):
            with pytest.raises(ActorError, match="KeyboardInterrupt"):
                call.get(timeout=BOUND_S)
    finally:
        rt.cell = before
    # The interrupt went to each host's router, which passed it on: no connection to a proc.
    control_ports = {int(p["address"].rpartition(":")[2]) for p in procs._procs}
    assert not [c for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr.port in control_ports]
    assert mesh.one.reduce(operator.add).get(timeout=BOUND_S) == HOSTS * PER_HOST  # they carry on


def test_a_ctrl_c_that_a_stopped_proc_cannot_confirm_says_so(routed, tmp_path):
    # Its router answers once its time is up, naming the proc that did not answer.
    import re

    from monarch_nb.client import in_flight

    _, procs, mesh = routed
    rt = runtime()
    gate = tmp_path / "gate"
    gate.touch()
    victim = procs.pids[PER_HOST + 1]  # hosts=1, gpus=1
    rt.cell, before = "stopped-cell", rt.cell
    try:
        running = mesh.hold.call(str(gate))
        os.kill(victim, signal.SIGSTOP)
        try:
            said = in_flight.interrupt(rt.in_flight.of_cell("stopped-cell"), timeout=3.0)
        finally:
            os.kill(victim, signal.SIGCONT)
        (what,) = said
        unconfirmed = re.fullmatch(r"rec\.hold \(ranks 0-\d+\) \((\d+) proc\(s\) did not confirm within 3 s\)", what)
        # Not every proc of its host: the router's answer naming the one came in time (it
        # waited the client's whole timeout, and its answer came too late). Others may be
        # slow to confirm on a loaded machine.
        assert unconfirmed and 1 <= int(unconfirmed.group(1)) < PER_HOST, what
        with pytest.raises(ActorError, match="KeyboardInterrupt"):
            running.get(timeout=BOUND_S)  # it lands once the proc runs again
    finally:
        rt.cell = before
    assert mesh.one.reduce(operator.add).get(timeout=BOUND_S) == HOSTS * PER_HOST


def test_one_ctrl_c_over_several_meshes_waits_for_their_procs_once_not_once_per_mesh(routed, tmp_path):
    # An RL loop's cell waits on a generator, a reward and a trainer mesh: a Ctrl-C that a
    # stopped proc can't confirm costs the notebook the interrupt's timeout once in all.
    import re
    import time

    from monarch_nb.client import in_flight

    _, procs, mesh = routed
    others = [procs.spawn(f"rec_{i}", Recorder) for i in range(2)]
    rt = runtime()
    gate = tmp_path / "gate"
    gate.touch()
    victim = procs.pids[1]
    rt.cell, before = "three-meshes-cell", rt.cell
    try:
        running = [m.hold.call(str(gate)) for m in (mesh, *others)]
        os.kill(victim, signal.SIGSTOP)
        try:
            started = time.monotonic()
            said = in_flight.interrupt(rt.in_flight.of_cell("three-meshes-cell"), timeout=3.0)
            took = time.monotonic() - started
        finally:
            os.kill(victim, signal.SIGCONT)
        assert [re.sub(r" \(\d+ proc\(s\) did not confirm within 3 s\)$", "", what) for what in said] == [
            f"{name}.hold (ranks 0-{HOSTS * PER_HOST - 1})" for name in ("rec", "rec_0", "rec_1")], said
        assert all("did not confirm" in what for what in said), said
        assert took < 2 * 3.0, f"three meshes took {took:.1f} s: the interrupt waited for each mesh in turn"
        for call in running:
            with pytest.raises(ActorError, match="KeyboardInterrupt"):
                call.get(timeout=BOUND_S)
    finally:
        rt.cell = before
        for m in others:
            m.stop()
    assert mesh.one.reduce(operator.add).get(timeout=BOUND_S) == HOSTS * PER_HOST


def test_a_proc_killed_mid_call_fails_that_call_and_the_others_answer(routed, tmp_path):
    c, procs, mesh = routed
    gate = tmp_path / "gate"
    gate.touch()
    victim = procs.pids[PER_HOST * 2 + 1]  # hosts=2, gpus=1
    pending = mesh.hold.call(str(gate))
    os.kill(victim, signal.SIGKILL)
    gate.unlink()  # the others return
    with pytest.raises(SupervisionError) as raised:
        pending.get(timeout=BOUND_S)
    assert f"1 of {HOSTS * PER_HOST} ranks" in str(raised.value), str(raised.value)
    procs.restart_failed()


def test_large_calls_queued_to_a_killed_proc_leave_no_shared_memory_once_its_death_is_known(routed, tmp_path):
    # Their segments stayed in /dev/shm until the host's sweep, 5 to 20 s later: the router
    # never let go of a dead proc's actors, as a client does.
    c, procs, mesh = routed
    victim_rank = PER_HOST * 3 + 2
    victim = mesh.slice(hosts=3, gpus=2)
    gate = tmp_path / "gate"
    gate.touch()
    holding = victim.hold.call_one(str(gate))
    queued = [victim.same.call_one(bytes(2 * shm.MIN_BYTES)) for _ in range(2)]  # behind the hold, unread
    cluster_id = c._info["cluster_id"]
    # Segment names: mnb-<cluster>-<sender pid>-<receiver's port>-<random>.
    to_victim = f"-{mesh._addresses[victim_rank].rpartition(':')[2]}-"
    assert wait_until(lambda: sum(to_victim in name for name in shm._segments(cluster_id)) == 2, BOUND_S)
    pid = procs.pids[victim_rank]
    os.kill(pid, signal.SIGKILL)
    gate.unlink()
    for future in (holding, *queued):
        with pytest.raises(SupervisionError):
            future.get(timeout=BOUND_S)

    def exit_recorded() -> bool:  # the agent tells the hub after letting go of the proc's actors
        proc = c.info()["proc_meshes"]["routed"]["procs"][victim_rank]
        return proc["pid"] == pid and proc["exit_code"] is not None

    assert wait_until(exit_recorded, BOUND_S)
    assert shm._segments(cluster_id) == []
    procs.restart_failed()


def test_a_killed_host_agent_is_a_host_lost_and_its_calls_fail(tmp_path, monkeypatch):
    monkeypatch.setenv(router_ops.ROUTER_ENV, router_ops.ROUTER_ON)
    c = Cluster.start_ephemeral(hosts=2)
    try:
        procs = c.host_mesh().spawn_procs(per_host={"gpus": 1}, name="two")
        mesh = procs.spawn("rec", Recorder)
        assert mesh.one.reduce(operator.add).get(timeout=BOUND_S) == 2
        gate = tmp_path / "gate"
        gate.touch()
        pending = mesh.hold.call(str(gate))
        agents = {h["host_id"]: h["pid"] for h in c.info()["hosts"]}
        os.kill(agents["host1"], signal.SIGKILL)  # its router with it: a thread of the agent
        gate.unlink()
        with pytest.raises(SupervisionError):
            pending.get(timeout=BOUND_S)
        assert wait_until(lambda: pids_alive([agents["host1"], procs.pids[1]]) == [], BOUND_S)
        assert mesh.slice(hosts=0).value.call(1).get(timeout=BOUND_S).values() == [100]
    finally:
        c.stop()
    assert wait_until(lambda: not cluster_processes(c.path), 15), cluster_processes(c.path)


def test_a_routed_call_leaves_the_client_as_one_message_to_its_relay(routed, monkeypatch):
    # The relay passes it on to the other hosts' routers; relays off, one per host.
    monkeypatch.setenv(router_ops.RELAY_ENV, router_ops.ROUTER_ON)
    cluster, _, mesh = routed
    mesh.one.call().get(timeout=BOUND_S)  # the route table is learnt (one hub request) before counting
    routers = {h["router"] for h in cluster.info()["hosts"]}
    mailbox = runtime().mailbox
    sent: list[str] = []
    send = Mailbox.send.__get__(mailbox)

    def counting(address, frames, *args, **kwargs):
        if address in routers:  # (not what other threads send meanwhile: the hub's, a timer's)
            sent.append(address)
        return send(address, frames, *args, **kwargs)

    monkeypatch.setattr(mailbox, "send", counting)
    expected = [100 + r for r in range(HOSTS * PER_HOST)]
    assert mesh.value.call(1).get(timeout=BOUND_S).values() == expected
    assert len(sent) == 1, sent
    sent.clear()
    monkeypatch.setenv(router_ops.RELAY_ENV, router_ops.ROUTER_OFF)
    assert mesh.value.call(1).get(timeout=BOUND_S).values() == expected
    assert len(sent) == len(set(sent)) == HOSTS, sent
    monkeypatch.setenv(router_ops.RELAY_ENV, "maybe")
    with pytest.raises(ValueError, match=router_ops.RELAY_ENV):
        mesh.value.call(1)


@contextlib.contextmanager
def _relayed_cluster(monkeypatch, hosts: int):
    """A cluster of ``hosts`` local hosts whose meshes this client calls through relays;
    stopped, every process gone, on the way out."""
    monkeypatch.setenv(router_ops.ROUTER_ENV, router_ops.ROUTER_ON)
    monkeypatch.setenv(router_ops.RELAY_ENV, router_ops.ROUTER_ON)
    c = Cluster.start_ephemeral(hosts=hosts)
    try:
        yield c
    finally:
        c.stop()
    assert wait_until(lambda: not cluster_processes(c.path), 15), cluster_processes(c.path)


def test_a_call_relayed_through_a_lost_host_fails_and_the_next_goes_through_another(tmp_path, monkeypatch):
    # The call's own ranks live on (none is on the relay's host): without the relay's
    # loss failing it, it waited for replies that went to a dead router.
    with _relayed_cluster(monkeypatch, 3) as c:
        procs = c.host_mesh().spawn_procs(per_host={"gpus": 1}, name="three")
        mesh = procs.spawn("rec", Recorder)
        assert mesh.one.reduce(operator.add).get(timeout=BOUND_S) == 3
        relay_of = functools.partial(runtime().host_routes.relay, mesh._cluster_id, mesh._key, (),
                                     runtime().supervision.router_lost)
        relay = relay_of()
        (relay_host,) = [h for h in c.info()["hosts"] if h["router"] == relay]
        assert relay_host["host_id"] == "host0"  # the first host's, in rank order
        others = mesh.slice(hosts=slice(1, 3))
        gate = tmp_path / "gate"
        gate.touch()
        pending = others.hold.call(str(gate))
        os.kill(relay_host["pid"], signal.SIGKILL)
        gate.unlink()
        with pytest.raises(SupervisionError, match="relayed through"):
            pending.get(timeout=BOUND_S)
        assert others.value.call(1).get(timeout=BOUND_S).values() == [100, 101]
        assert relay_of() not in (relay, None)


def test_losing_a_meshs_relay_fails_no_call_to_a_mesh_with_no_rank_on_its_host(tmp_path, monkeypatch):
    # Each mesh's calls go through a relay on one of its own hosts: an RL loop's or a
    # replica group's meshes on other hosts go on when one mesh's host is lost.
    with _relayed_cluster(monkeypatch, 3) as c:
        procs = c.host_mesh().spawn_procs(per_host={"gpus": 2}, name="six")
        first = procs.slice(hosts=slice(0, 2), gpus=0).spawn("first", Recorder)  # on hosts 0 and 1
        second = procs.slice(hosts=slice(1, 3), gpus=1).spawn("second", Recorder)  # on hosts 1 and 2
        for mesh in (first, second):
            assert mesh.one.call().get(timeout=BOUND_S).values() == [1, 1]
        hosts = {h["host_id"]: h for h in c.info()["hosts"]}
        rt = runtime()

        def relay(mesh) -> str | None:
            return rt.host_routes.relay(mesh._cluster_id, mesh._key, (), rt.supervision.router_lost)

        assert (relay(first), relay(second)) == (hosts["host0"]["router"], hosts["host1"]["router"])
        gate = tmp_path / "gate"
        gate.touch()
        pending = second.hold.call(str(gate))
        os.kill(hosts["host0"]["pid"], signal.SIGKILL)
        assert wait_until(lambda: rt.supervision.router_lost(first._cluster_id, hosts["host0"]["router"]) is not None, BOUND_S)
        gate.unlink()
        assert pending.get(timeout=BOUND_S).values() == ["released", "released"]
        assert second.value.call(1).get(timeout=BOUND_S).values() == [100, 101]
        with pytest.raises(SupervisionError):
            first.one.call().get(timeout=BOUND_S)


def test_a_port_streamed_by_a_live_actor_reaches_the_client_again_once_its_relays_host_is_lost(
        tmp_path, monkeypatch):
    # Its values went to the dead relay for ever; once the hub's heartbeat names the lost
    # host's router, the actor's router sends them straight to the client.
    from monarch_nb.actor import Channel

    with _relayed_cluster(monkeypatch, 3) as c:
        procs = c.host_mesh().spawn_procs(per_host={"gpus": 1}, name="three")
        mesh = procs.spawn("rec", Recorder)
        assert mesh.one.call().get(timeout=BOUND_S).values() == [1, 1, 1]  # its relay: host0's router
        hosts = {h["host_id"]: h for h in c.info()["hosts"]}
        port, receiver = Channel.open()
        stop = tmp_path / "stop"
        mesh.slice(hosts=2).stream_until.broadcast(port, str(stop))
        last = receiver.recv().get(timeout=BOUND_S)  # flowing, through the relay
        os.kill(hosts["host0"]["pid"], signal.SIGKILL)
        try:
            # A value sent ~4 s after the kill (200 x 20 ms), well after the routers heard.
            while last < 200:
                last = receiver.recv().get(timeout=BOUND_S)
        finally:
            stop.touch()


def _all_threads_stopped(pid: int) -> bool:
    return all(_thread_state(pid, tid) == "T" for tid in os.listdir(f"/proc/{pid}/task"))


def _thread_state(pid: int, tid: str) -> str:
    with open(f"/proc/{pid}/task/{tid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0]


def test_a_call_failed_while_its_host_agent_was_stopped_is_not_run_when_it_comes_back(monkeypatch):
    # The call waited in the stopped router's inbox; its caller was told the host was
    # lost; the host was taken back, and the router delivered it: a call reported failed
    # ran (a caller that retries on SupervisionError did the work twice).
    monkeypatch.setenv(router_ops.ROUTER_ENV, router_ops.ROUTER_ON)
    c = Cluster.start_ephemeral(hosts=2)
    agent = None
    try:
        procs = c.host_mesh().spawn_procs(per_host={"gpus": 1}, name="two")
        mesh = procs.spawn("rec", Recorder)
        assert mesh.one.reduce(operator.add).get(timeout=BOUND_S) == 2
        agent = next(h["pid"] for h in c.info()["hosts"] if h["host_id"] == "host1")
        os.kill(agent, signal.SIGSTOP)
        # Every thread stopped (its router's too) before the call is sent: one sent just
        # before ran, and only its reply waited, which is the usual lost host's doubt.
        assert wait_until(lambda: _all_threads_stopped(agent), BOUND_S)
        with pytest.raises(SupervisionError, match="lost"):
            mesh.record.call("while stopped", 1).get(timeout=BOUND_S)
        os.kill(agent, signal.SIGCONT)
        assert wait_until(lambda: not any(h["lost"] for h in c.info()["hosts"]), BOUND_S), "host1 not taken back"
        # ... and this client heard so (the hub's actors_back comes on the event socket,
        # after info() may say it: a call sent before it fails as to a lost host's actor)
        supervision = runtime().supervision
        assert wait_until(lambda: supervision.why_dead(mesh._cluster_id, mesh._addresses[1], mesh._name, 1) is None,
                          BOUND_S)
        assert mesh.seen_by.call("while stopped").get(timeout=BOUND_S).values() == [[1], []]
        assert mesh.record.call("after", 2).get(timeout=BOUND_S).values() == [2, 2]  # and it relays again
    finally:
        if agent is not None:
            os.kill(agent, signal.SIGCONT)
        c.stop()
    assert wait_until(lambda: not cluster_processes(c.path), 15), cluster_processes(c.path)


def test_a_bad_router_setting_is_refused_naming_the_choices(routed, monkeypatch):
    _, _, mesh = routed
    monkeypatch.setenv(router_ops.ROUTER_ENV, "sometimes")
    with pytest.raises(ValueError, match="MONARCH_NB_ROUTER='sometimes'.*'off', 'on'"):
        mesh.one.call()


def test_a_relay_that_faults_fails_its_own_hosts_calls_and_passes_the_other_hosts_replies_on(tmp_path, monkeypatch):
    # Its start over clears what it held for the other hosts' replies, not the route
    # back: they still reach the client through it.
    from monarch_nb.ft import inject_fault

    with _relayed_cluster(monkeypatch, 3) as c:
        procs = c.host_mesh().spawn_procs(per_host={"gpus": 1}, name="three")
        mesh = procs.spawn("rec", Recorder)
        assert mesh.one.reduce(operator.add).get(timeout=BOUND_S) == 3
        relay = runtime().host_routes.relay(mesh._cluster_id, mesh._key, (), runtime().supervision.router_lost)
        assert [h["host_id"] for h in c.info()["hosts"] if h["router"] == relay] == ["host0"]
        gate = tmp_path / "gate"
        gate.touch()
        arriving = mesh.record_after.stream(str(gate), "relayed", 0)
        inject_fault(mesh, "router", ranks=[0])
        with pytest.raises(ActorError, match="router of host host0 failed"):
            next(arriving).get()  # rank 0's, on the relay's own host: while the others still wait
        gate.unlink()
        assert [f.get() for f in arriving] == [None, None]
        assert mesh.seen_by.call("relayed").get(timeout=BOUND_S).values() == [[0]] * 3
        assert runtime().host_routes.relay(mesh._cluster_id, mesh._key, (), runtime().supervision.router_lost) == relay


def test_a_routed_call_in_flight_when_the_hub_dies_fails_naming_the_hub_not_a_bare_exit_code(tmp_path, monkeypatch):
    # The router fails it as its host agent stops every proc (an ephemeral cluster's hub
    # silent for 2 s): it said "proc p/1 ... exited with code -15", not why.
    monkeypatch.setenv(router_ops.ROUTER_ENV, router_ops.ROUTER_ON)
    c = Cluster.start_ephemeral(hosts=2)
    gate = tmp_path / "gate"
    gate.touch()
    try:
        mesh = c.host_mesh().spawn_procs(per_host={"gpus": 1}, name="orphaned").spawn("rec", Recorder)
        pending = mesh.hold.call(str(gate))
        os.kill(c._info["hub_pid"], signal.SIGKILL)
        with pytest.raises(SupervisionError, match="hub"):
            pending.get(timeout=BOUND_S)
    finally:
        c.stop()
    assert wait_until(lambda: not cluster_processes(c.path), 15), cluster_processes(c.path)
