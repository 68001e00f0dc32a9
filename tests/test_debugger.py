"""Distributed breakpoints against real procs with real debugpy: breakpoint() in
endpoints, breakpoints set from the client, eval across ranks, continue, post-mortem,
stale entries, and an IDE attaching through the relay with a plain DAP client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from monarch_nb.actor import ActorError, SupervisionError
from monarch_nb.client.debugger import Debugger, _location
from monarch_nb.client.hub_client import HubClient
from monarch_nb.errors import InvalidRequest
from monarch_nb.protocol import hub_ops

from conftest import pids_alive, wait_until
from debug_actors import BREAK_LINE, COMPUTE_LINE, AsyncPaused, Paused
import debug_actors

FILE = os.path.abspath(debug_actors.__file__)


@pytest.fixture(scope="module")
def dbg(cluster):
    return cluster.debugger


@pytest.fixture(scope="module")
def paused4(procs4):
    return procs4.spawn("paused", Paused)


@pytest.fixture(autouse=True)
def clean_debugger(dbg):
    yield
    dbg.continue_all()
    dbg.clear_breakpoints()
    dbg.post_mortem(False)
    assert wait_until(lambda: not dbg.paused(), 10)


class _Shapes:
    """Methods whose first statement a line reader got wrong (see the test below)."""

    def commented(self, x):  # a signature ending in a comment
        if x:
            x = 0
        return x

    def one_line(self, x): return x + 1  # noqa: E704

    def documented(self):
        """A docstring runs no code: a breakpoint there is never hit."""
        return 1


def test_a_breakpoint_by_function_name_goes_on_its_first_statement_that_runs():
    # It went inside the `if` (a signature ending in a comment: a line that may never
    # run) and on the decorator line (a one-line method), with nothing said.
    lines = {name: _location(getattr(_Shapes, name), None)[1] for name in ("commented", "one_line", "documented")}
    with open(__file__) as source:
        text = source.read().splitlines()
    assert {name: text[n - 1].strip() for name, n in lines.items()} == {
        "commented": "if x:", "one_line": "def one_line(self, x): return x + 1  # noqa: E704",
        "documented": "return 1"}


def test_breakpoint_pauses_every_rank_eval_in_all_then_continue_returns(dbg, paused4, cluster):
    future = paused4.work.call(4)
    stops = dbg.wait_paused(4, "paused", timeout=60)
    assert [s.rank for s in stops] == [0, 1, 2, 3]  # the same line in 4 ranks: 4 distinguishable entries
    assert {(s.file, s.line, s.function, s.endpoint, s.reason) for s in stops} == {
        (FILE, BREAK_LINE, "work", "work", "breakpoint")}
    assert len({s.pid for s in stops}) == 4 and all(s.host and s.since for s in stops)
    assert not future.done()
    health = cluster.health()
    assert health["counts"]["paused"] == 4
    actors = [a for h in health["hosts"] for p in h["procs"] for a in p["actors"] if a["mesh"] == "paused"]
    assert {a["state"] for a in actors} == {"paused"} and actors[0]["line"] == BREAK_LINE
    results = dbg.eval("y", "paused")
    assert {rank: text for (_, rank), text in results.items()} == {0: "40", 1: "41", 2: "42", 3: "43"}
    assert dbg.eval("x", paused4).folded() == [("paused", [0, 1, 2, 3], "4")]  # equal results fold
    with pytest.raises(TimeoutError, match=r"paused rank\(s\) 0, 1, 2, 3 are paused in the debugger"):
        future.get(timeout=0.5)  # a call that waits on paused ranks says so
    assert sorted(dbg.continue_("paused")) == [0, 1, 2, 3]
    assert list(future.get(timeout=30).values()) == [41, 42, 43, 44]
    assert wait_until(lambda: not dbg.paused(), 10)


def test_a_listing_older_than_a_stop_event_does_not_hide_the_stop(cluster, paused4, monkeypatch):
    # Seen under load: the event of a new stop overtakes a listing the hub made before
    # it; wait_paused must still see the stop (it timed out while health showed it).
    fresh = Debugger(cluster)
    heard = threading.Event()
    fresh.watch(lambda stops: stops and heard.set())
    real, calls = HubClient.request, []

    def listing_overtaken_by_the_event(self, op, *args, **kwargs):
        reply = real(self, op, *args, **kwargs)
        if op == hub_ops.DEBUG_PAUSED and not calls:  # made before the stop: returned after its event
            calls.append(paused4.slice(gpus=1).work.call_one(4))
            assert heard.wait(60)
        return reply

    monkeypatch.setattr(HubClient, "request", listing_overtaken_by_the_event)
    try:
        stops = fresh.wait_paused(1, "paused", timeout=20)
    finally:
        monkeypatch.undo()
        fresh.close()
    assert [s.rank for s in stops] == [1]
    cluster.debugger.continue_all()
    assert calls[0].get(timeout=30) == 42


def test_breakpoint_pauses_an_async_actor_too(dbg, procs4):
    mesh = procs4.slice(gpus=0).spawn("apaused", AsyncPaused)
    future = mesh.work.call_one(4)
    stops = dbg.wait_paused(1, "apaused", timeout=60)
    assert [(s.function, s.endpoint) for s in stops] == [("work", "work")]
    assert list(dbg.eval("y", "apaused").values()) == ["40"]
    dbg.continue_("apaused")
    assert future.get(timeout=30) == 41


def test_after_continue_nothing_is_traced_until_a_breakpoint_is_set(dbg, paused4):
    future = paused4.work.call(0)
    dbg.wait_paused(4, "paused", timeout=60)
    dbg.continue_all()
    future.get(timeout=30)
    # Armed, nothing to stop for: no trace function, so the procs run at full speed
    # (a resumed thread may re-set its own on the way out of debugpy: untraced again soon).
    def untraced():
        return list(paused4.traced.call().get(timeout=30).values()) == [False] * 4

    assert wait_until(untraced, 5)
    bp = dbg.set_breakpoint(FILE, COMPUTE_LINE, mesh="paused", ranks=[0])
    assert list(paused4.traced.call().get(timeout=30).values()) == [True] * 4
    dbg.clear_breakpoints(bp["id"])
    assert wait_until(untraced, 5)


def test_where_locals_and_next_on_one_rank(dbg, paused4):
    future = paused4.slice(gpus=1).work.call_one(2)
    dbg.wait_paused(1, "paused", timeout=60)
    frames = dbg.where("paused", 1)
    assert (frames[0].file, frames[0].line, frames[0].function) == (FILE, BREAK_LINE, "work")
    assert frames[0].source.strip() == "z = y + 1"
    assert all("monarch_nb" not in (f.file or "") for f in frames)  # the runtime's frames are hidden
    assert dbg.locals("paused", 1)["y"] == "21"
    moved = dbg.next("paused", [1])
    assert moved[1].line == BREAK_LINE + 1 and moved[1].reason == "step"
    assert dbg.eval("z", "paused", 1)[("paused", 1)] == "22"
    dbg.continue_("paused", 1)
    assert future.get(timeout=30) == 22


def test_a_next_over_a_slow_line_answers_still_running_after_its_wait_and_the_call_ends(dbg, paused4):
    future = paused4.slice(gpus=3).doze.call_one(4.0)
    dbg.wait_paused(1, "paused", timeout=60)
    assert dbg.next("paused", [3], wait_s=1.0) == {3: None}  # answered after its wait: the 4 s sleep runs on
    assert future.get(timeout=60) == 4.0
    assert not dbg.paused()


def test_an_interrupt_leaves_a_rank_paused_at_a_breakpoint_paused_and_inspectable(dbg, paused4, procs4):
    # The interrupt ended the rank's wait in the debugger, which did not know: the rank was
    # still listed as paused, `where` showed nothing, `eval` failed ("no user frame").
    future = paused4.slice(gpus=2).work.call_one(3)
    dbg.wait_paused(1, "paused", timeout=60)
    procs4.interrupt()
    with pytest.raises(TimeoutError):
        future.get(timeout=1.0)  # the rank is still paused, and its call with it
    assert dbg.where("paused", 2)[0].line == BREAK_LINE
    assert dbg.eval("y", "paused", 2)[("paused", 2)] == "32"
    dbg.continue_("paused", 2)  # the interrupt was dropped: the call runs on (it hung, the interrupt
    assert future.get(timeout=30) == 33  # deferred and landing in pydevd's code on the way back)
    assert wait_until(lambda: not dbg.paused(), 10)


def test_double_continue_is_harmless(dbg, paused4):
    future = paused4.slice(gpus=0).work.call_one(1)
    stop = dbg.wait_paused(1, "paused", timeout=60)[0]
    assert dbg.continue_("paused", 0) == [0]
    answer = dbg._ask([stop], "continue")[0]  # the stale entry a slow client may still hold
    assert answer == {"continued": False}
    assert future.get(timeout=30) == 11
    with pytest.raises(InvalidRequest, match="not paused"):
        dbg.continue_("paused", 0)


def test_breakpoint_from_client_on_function_pickled_by_value(dbg, procs4):
    # Defined here, so cloudpickle sends it by value (as a notebook cell's class).
    from monarch_nb.actor import Actor, endpoint

    class Local(Actor):
        @endpoint
        def double(self, v):
            doubled = v * 2
            return doubled

    mesh = procs4.spawn("local_by_value", Local)
    try:
        bp = dbg.set_breakpoint(Local.double, mesh="local_by_value")  # first body line
        assert bp["file"] == os.path.abspath(__file__)
        future = mesh.double.call(5)
        stops = dbg.wait_paused(4, "local_by_value", timeout=60)
        assert {(s.file, s.line, s.function) for s in stops} == {(bp["file"], bp["line"], "double")}
        assert dbg.where("local_by_value", 3)[0].source.strip() == "doubled = v * 2"
        dbg.clear_breakpoints(bp["id"])
        dbg.continue_("local_by_value")
        assert list(future.get(timeout=30).values()) == [10] * 4
        assert list(mesh.double.call(1).get(timeout=30).values()) == [2] * 4  # cleared: no stop
    finally:
        mesh.stop()


def test_conditional_breakpoint_pauses_only_rank_2(dbg, paused4):
    bp = dbg.set_breakpoint(f"{FILE}:{COMPUTE_LINE}", mesh="paused", condition="rank == 2")
    assert {b["proc_id"] for b in bp["bound"]} == {f"procs4/{r}" for r in range(4)}
    assert dbg.breakpoints() == [{k: v for k, v in bp.items() if k != "bound"}]  # where it bound: at set time only
    futures = [paused4.slice(gpus=r).compute.call_one(10) for r in range(4)]
    stops = dbg.wait_paused(1, "paused", timeout=60)
    assert [f.get(timeout=30) for i, f in enumerate(futures) if i != 2] == [20, 22, 26]
    assert [(s.rank, s.line) for s in dbg.paused()] == [(2, COMPUTE_LINE)] == [(s.rank, s.line) for s in stops]
    results = dbg.eval("1 + 1", "paused", "0-3")  # evaluated where paused; the others named
    assert dict(results) == {("paused", 2): "2"} and results.not_paused == ("paused", [0, 1, 3])
    assert repr(results).splitlines() == ["[paused 2] 2", "(paused rank(s) 0-1,3 not paused: not evaluated)"]
    dbg.continue_("paused", 2)
    assert futures[2].get(timeout=30) == 24


def test_breakpoint_limited_to_ranks(dbg, paused4):
    dbg.set_breakpoint(FILE, COMPUTE_LINE, mesh=paused4, ranks="1,3")
    future = paused4.compute.call(0)
    assert [s.rank for s in dbg.wait_paused(2, "paused", timeout=60)] == [1, 3]
    assert dbg.continue_all() == 2
    assert list(future.get(timeout=30).values()) == [0, 2, 4, 6]


def test_bad_breakpoints_and_requests_name_the_problem(dbg, paused4):
    with pytest.raises(InvalidRequest, match="no actor mesh 'nope'"):
        dbg.set_breakpoint(FILE, COMPUTE_LINE, mesh="nope")
    with pytest.raises(InvalidRequest, match="outside 'paused'"):
        dbg.set_breakpoint(FILE, COMPUTE_LINE, mesh="paused", ranks=[7])
    with pytest.raises(InvalidRequest, match="not a Python expression"):
        dbg.set_breakpoint(FILE, COMPUTE_LINE, condition="rank ==")
    with pytest.raises(InvalidRequest, match="FILE:LINE"):
        dbg.set_breakpoint("debug_actors.py")
    with pytest.raises(InvalidRequest, match="has lines 1-"):
        dbg.set_breakpoint(FILE, 99999)
    with pytest.raises(InvalidRequest, match="it spans lines"):  # a line outside the function
        dbg.set_breakpoint(test_bad_breakpoints_and_requests_name_the_problem, 1)
    with pytest.raises(InvalidRequest, match="no rank of 'paused' is paused"):
        dbg.eval("1", "paused")
    with pytest.raises(InvalidRequest, match=r"no rank 99 in 'paused' \(ranks 0-3\)"):
        dbg.where("paused", 99)
    with pytest.raises(InvalidRequest, match="no breakpoint with id 999"):
        dbg.clear_breakpoints(999)
    assert list(paused4.spin.call(10).get(timeout=30).values()) == [45] * 4  # still healthy


def test_stale_entry_leaves_the_list_when_its_proc_is_killed(dbg, host):
    procs = host.spawn_procs(per_host={"gpus": 2}, name="doomed")
    try:
        mesh = procs.spawn("doomed_actors", Paused)
        future = mesh.work.call(1)
        stops = dbg.wait_paused(2, "doomed_actors", timeout=60)
        os.kill(stops[1].pid, signal.SIGKILL)
        assert wait_until(lambda: [s.rank for s in dbg.paused("doomed_actors")] == [0], 5)
        with pytest.raises(SupervisionError):
            future.get(timeout=30)
    finally:
        procs.stop()
    assert wait_until(lambda: not dbg.paused("doomed_actors"), 5)


def test_post_mortem_pauses_at_the_exception_then_returns_the_error(dbg, paused4):
    assert dbg.post_mortem(True) is True
    future = paused4.slice(gpus=3).fail.call_one(4)
    stop = dbg.wait_paused(1, "paused", timeout=60)[0]
    assert (stop.rank, stop.reason, stop.function, stop.endpoint) == (3, "exception", "fail", "fail")
    assert "bad batch 7" in (stop.text or "")
    assert dbg.eval("doomed", "paused", 3)[("paused", 3)] == "7"
    assert not future.done()
    dbg.continue_("paused", 3)
    with pytest.raises(ActorError, match="bad batch 7"):
        future.get(timeout=30)
    assert dbg.post_mortem(False) is False
    with pytest.raises(ActorError):
        paused4.slice(gpus=3).fail.call_one(4).get(timeout=30)  # off: the error comes at once


DAP_SCRIPT = r"""
import json, socket, sys
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
stream = sock.makefile("rb")
seq = 0
def send(command, **arguments):
    global seq
    seq += 1
    body = json.dumps({"seq": seq, "type": "request", "command": command, "arguments": arguments}).encode()
    sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return seq
def read():
    length = int(stream.readline().split(b":")[1]); stream.readline()
    return json.loads(stream.read(length))
def response(n):
    while True:
        m = read()
        if m["type"] == "event":
            events.append(m)
        elif m["request_seq"] == n:
            return m
events = []
out = {}
out["initialize"] = response(send("initialize", adapterID="debugpy", clientID="vscode"))["success"]
out["attach"] = response(send("attach", justMyCode=True))["success"]
out["setBreakpoints"] = response(send("setBreakpoints", source={"path": sys.argv[2]}, breakpoints=[{"line": 1000}]))["body"]
response(send("configurationDone"))
while not any(e["event"] == "stopped" for e in events):
    events.append(read())
tid = next(e for e in events if e["event"] == "stopped")["body"]["threadId"]
frames = response(send("stackTrace", threadId=tid))["body"]["stackFrames"]
out["top"] = [frames[0]["name"], frames[0]["line"]]
out["eval"] = response(send("evaluate", expression="y * 2", frameId=frames[0]["id"], context="repl"))["body"]["result"]
out["continue"] = response(send("continue", threadId=tid))["success"]
response(send("disconnect"))
print(json.dumps(out))
"""


def test_broadcast_breakpoint_stays_listed_and_an_ide_attaches_through_the_relay(dbg, paused4):
    paused4.slice(gpus=2).work.broadcast(3)  # fire and forget: nobody waits for it
    stop = dbg.wait_paused(1, "paused", timeout=60)[0]
    assert (stop.rank, stop.endpoint) == (2, "work")
    relay = dbg.attach("paused", 2)
    try:
        config = relay.launch_config()
        assert config["connect"] == {"host": "127.0.0.1", "port": relay.port} and config["request"] == "attach"
        done = subprocess.run([sys.executable, "-c", DAP_SCRIPT, str(relay.port), FILE], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["initialize"] and out["attach"]
        assert len(out["setBreakpoints"]["breakpoints"]) == 1  # its own breakpoints only
        assert out["top"] == ["work", BREAK_LINE] and out["eval"] == "64" and out["continue"]
        assert wait_until(lambda: not dbg.paused(), 10)
    finally:
        relay.close()
    assert list(paused4.spin.call(3).get(timeout=30).values()) == [3] * 4


def test_paused_ranks_are_listed_again_by_a_recovered_hub():
    import monarch_nb
    from monarch_nb import cluster_dir
    from monarch_nb.client.runtime import runtime

    from conftest import cluster_processes

    previous = runtime().cluster
    cluster = monarch_nb.Cluster.start("dbg-phoenix", grace_s=30)
    try:
        procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 2}, name="p")
        mesh = procs.spawn("phoenix_actors", Paused)
        mesh.work.broadcast(2)
        assert len(cluster.debugger.wait_paused(2, "phoenix_actors", timeout=60)) == 2
        os.kill(cluster._info["hub_pid"], signal.SIGKILL)
        assert wait_until(lambda: not pids_alive([cluster._info["hub_pid"]]), 10)
        again = monarch_nb.Cluster.recover("dbg-phoenix")
        stops = again.debugger.paused("phoenix_actors")
        assert [(s.rank, s.line) for s in stops] == [(0, BREAK_LINE), (1, BREAK_LINE)]
        assert again.debugger.eval("y", "phoenix_actors").folded() == [("phoenix_actors", [0], "20"),
                                                                      ("phoenix_actors", [1], "21")]
        assert again.debugger.continue_all() == 2
    finally:
        path = cluster_dir.cluster_path("dbg-phoenix")
        subprocess.run([sys.executable, "-m", "monarch_nb.cli", "cluster", "stop", "dbg-phoenix"],
                       capture_output=True, timeout=60)
        assert wait_until(lambda: not cluster_processes(path), 15)
        runtime().cluster = previous
