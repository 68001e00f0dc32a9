"""Logs: every line of every proc reaches the hub's store (also C-level output and a
dying proc's last words), attributed to mesh and rank; lines caused by a call come
back to the caller, identical lines of several ranks folded, nothing dropped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from monarch_nb import cluster_dir
from monarch_nb.client import logs
from monarch_nb.client.cluster import Cluster
from monarch_nb.client.runtime import runtime
from monarch_nb.errors import InvalidRequest
from monarch_nb.mesh.ranks import parse_ranks

from conftest import cluster_processes, wait_until
from kernels import TESTS
from sample_actors import Printer


def _routed_lines(origins: list[str | None], clients: dict[str, bool]) -> dict[str, list[str | None]]:
    """Which client the hub sends each line to: one line per origin, to clients of
    ``clients`` (client id -> whether it takes lines); returns client id -> origins."""
    import asyncio
    from types import SimpleNamespace

    from monarch_nb.hub.log_ops import LogOps
    from monarch_nb.hub.logstore import LogStore

    sent: dict[str, list] = {}

    class Net:
        async def send(self, address, header):
            sent.setdefault(address, []).extend(record[7] for record in header["records"])

    table = {c: SimpleNamespace(wants_lines=wants, log_address=c, log_seq=0) for c, wants in clients.items()}
    ops = LogOps(LogStore(None), SimpleNamespace(), SimpleNamespace(table=table), Net(), "cluster")
    lines = [(0.0, "p/0", "stdout", "m", 0, origin, f"line of {origin}", 8) for origin in origins]
    asyncio.run(ops.log_lines({"host_id": "h0", "lines": lines}, None))
    return sent


def test_a_line_goes_to_the_client_whose_call_caused_it_and_a_gone_clients_to_nobody():
    # A restarted kernel's call went on printing, and its lines showed under another
    # notebook's running cell as that notebook's own.
    sent = _routed_lines(["a:cell-1", None, "proc-client:x", "gone:cell-3"], {"a": True, "b": True,
                                                                            "proc-client": False})
    assert sent == {"a": ["a:cell-1", None, "proc-client:x"], "b": [None, "proc-client:x"]}


class Collected:
    """A sink that keeps what the log receiver shows."""

    def __init__(self):
        self.lines: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, lines):
        with self.lock:
            self.lines += [f"{line.stream}: {line}" for line in lines]


@pytest.fixture
def shown(cluster):
    """What the log receiver shows during the test (lines of earlier tests go first)."""
    cluster.flush_logs()
    receiver = runtime().lines
    collected = Collected()
    receiver.sink = collected
    yield collected
    receiver.sink = logs.print_sink


@pytest.fixture(scope="module")
def printers(procs4):
    return procs4.spawn("printers", Printer)


def test_lines_of_a_call_come_back_to_the_caller_folded_by_rank(cluster, printers, shown):
    assert printers.say.call(["epoch 1 done", "42", "7"]).get().values() == [0, 1, 2, 3]
    printers.slice(gpus=2).say.call_one(["only rank two"]).get()
    printers.say.call(["uh oh"], stream="stderr").get()
    assert cluster.flush_logs()
    assert shown.lines[:3] == ["stdout: [printers 0-3] epoch 1 done", "stdout: [printers 0-3] 42",
                               "stdout: [printers 0-3] 7"]
    assert shown.lines[3:] == ["stdout: [printers 2] only rank two", "stderr: [printers 0-3] uh oh"]


def test_lines_that_differ_are_never_merged_and_number_only_lines_are_kept(cluster, printers, shown):
    for rank in range(4):
        printers.slice(gpus=rank).say.call_one([str(rank), "same"]).get()
    assert cluster.flush_logs()
    numbers = [line for line in shown.lines if "same" not in line]
    assert sorted(numbers) == [f"stdout: [printers {r}] {r}" for r in range(4)]
    # Each rank printed its number first: "same" folds only as far as order allows.
    same_ranks = [line.split("]")[0].split()[-1] for line in shown.lines if "same" in line]
    assert sorted(r for part in same_ranks for r in parse_ranks(part)) == [0, 1, 2, 3]


def test_folding_off_shows_one_line_per_rank(cluster, printers, shown):
    runtime().lines.folder.enabled = False
    try:
        printers.say.call(["unfolded"]).get()
        assert cluster.flush_logs()
    finally:
        runtime().lines.folder.enabled = True
    assert sorted(shown.lines) == [f"stdout: [printers {r}] unfolded" for r in range(4)]


def test_c_level_output_is_captured_and_attributed_to_the_proc(cluster, printers, procs4):
    printers.slice(gpus=1).from_c.call_one("written by printf").get()
    assert cluster.flush_logs()
    [record] = cluster.logs(grep="written by printf")
    assert (record["mesh"], record["rank"], record["stream"]) == (procs4.name, 1, "stdout")


def test_eight_ranks_by_ten_thousand_lines_are_stored_complete_and_in_order(cluster, host, shown):
    procs = host.spawn_procs(per_host={"gpus": 8}, name="flood")
    try:
        flood = procs.spawn("flooders", Printer)
        assert flood.numbered.call(10_000).get().values() == [10_000] * 8
        assert cluster.flush_logs(timeout=30)
        records = cluster.logs(mesh="flooders")
        assert len(records) == 80_000
        for rank in range(8):
            texts = [r["text"] for r in records if r["rank"] == rank]
            assert texts == [f"r{rank} line {i}" for i in range(10_000)]
        assert len(shown.lines) == 80_000  # every line came back to this client too
    finally:
        procs.stop()


def test_a_proc_killed_mid_print_keeps_its_last_lines(cluster, host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="doomed")
    try:
        procs.spawn("doomed", Printer).print_then_die.broadcast(500)
        assert wait_until(lambda: len(cluster.logs(mesh="doomed", grep="last words")) == 500, 20)
        assert cluster.logs(mesh="doomed", tail=1)[0]["text"] == "last words 499"
    finally:
        procs.stop()


def test_queries_filter_by_mesh_rank_stream_pattern_and_tail(cluster, printers):
    printers.say.call(["query me out"]).get()
    printers.say.call(["query me err"], stream="stderr").get()
    assert cluster.flush_logs()
    assert sorted(r["rank"] for r in cluster.logs(mesh="printers", grep="^query me", ranks=[1, 3])) == [1, 1, 3, 3]
    assert {r["text"] for r in cluster.logs(grep="query me", stream="stderr")} == {"query me err"}
    assert len(cluster.logs(grep="query me", tail=3)) == 3
    assert cluster.logs(grep="query me", since=-3600)
    with pytest.raises(InvalidRequest, match="bad grep pattern"):
        cluster.logs(grep="(")


def test_lines_are_queryable_by_a_client_that_connects_later(cluster, printers):
    printers.say.call(["for the next client"]).get()
    assert cluster.flush_logs()
    script = ("import monarch_nb.client.cluster as c, json, sys\n"
              f"cl = c.Cluster({cluster.name!r}, c.Path({str(cluster.path)!r}), c.cluster_dir.read_info(c.Path({str(cluster.path)!r})))\n"
              "print(json.dumps(sorted(r['rank'] for r in cl.logs(grep='for the next client'))))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=TESTS)
    assert out.stdout.strip() == "[0, 1, 2, 3]", out.stderr


def test_a_mesh_that_is_not_there_is_named_with_the_meshes_there_are():
    info = {"proc_meshes": {"workers": {}}, "actor_meshes": {"workers/trainers": {}}}
    assert logs.no_such_mesh(info, "workers") is None and logs.no_such_mesh(info, "trainers") is None
    assert logs.no_such_mesh(info, "nosuchmesh") == ("no mesh 'nosuchmesh' and no lines of it in the store "
                                                     "(meshes: workers, workers/trainers)")
    assert logs.no_such_mesh({"proc_meshes": {}, "actor_meshes": {}}, "x").endswith("(meshes: none)")


def test_folder_keeps_each_ranks_order():
    folder = logs.Folder(window=10)
    for rank, text in [(1, "A"), (0, "B"), (0, "A"), (1, "B")]:
        folder.add([0, 0, "h", "p/0", "stdout", "m", rank, None, text], 0.0)
    shown = folder.take()
    # The two ranks printed A and B in opposite orders: one of the texts folds, and each
    # rank's own lines still show in the order it printed them.
    assert len(shown) == 3
    assert [g.text for g in shown if 0 in g.ranks] == ["B", "A"]
    assert [g.text for g in shown if 1 in g.ranks] == ["A", "B"]


def test_a_ranks_burst_of_one_text_folds_with_the_other_ranks_same_printings():
    # Each rank prints "tick" three times; each proc's lines arrive as one burst. A rank's
    # n-th tick joins the others' n-th: three lines naming all four ranks, not a burst of
    # one rank joined to another rank's newest tick (issue 23: 8-9 lines, mixed ranks).
    folder = logs.Folder(window=10)
    for rank in (0, 1, 2, 3):
        for _ in range(3):
            folder.add([0, 0, "h", f"p/{rank}", "stdout", "t", rank, None, "tick", 4], 0.0)
    assert [str(g) for g in folder.take()] == ["[t 0-3] tick"] * 3


def test_stored_lines_fold_by_each_ranks_printings_too():
    records = [[0, 0, "h", f"p/{rank}", "stdout", "t", rank, f"c:{call}", "tick", 2]
               for call in (1, 2) for rank in (1, 0) for _ in range(2)]
    assert [str(g) for g in logs.fold_records(records)] == ["[t 0-1] tick"] * 4


def test_a_late_ranks_line_of_the_previous_call_does_not_keep_it_from_folding():
    # Lines reach the hub apart from replies: rank 2's last line of call 1 arrived after
    # the other ranks' first line of call 2 (seen with CPU hogs beside 8 ranks).
    folder = logs.Folder(window=10)

    def line(rank, text):
        folder.add([0, 0, "h", f"p/{rank}", "stdout", "m", rank, None, text, 3], 0.0)

    for rank in (0, 1):
        line(rank, "call 1 done")
    line(0, "rank 0 only")
    for rank in (0, 1):
        line(rank, "call 2 start")
    line(2, "call 1 done")  # joins the first group: nothing of rank 2 came before
    line(2, "rank 2 only")
    line(2, "call 2 start")  # joins too: its "rank 2 only" moves ahead of the group
    assert [str(g) for g in folder.take()] == [
        "[m 0-2] call 1 done", "[m 0] rank 0 only", "[m 2] rank 2 only", "[m 0-2] call 2 start"]


def test_log_records_tagged_with_their_actor_fold_without_the_tag():
    # An actor's logging records carry Monarch's [actor=...] tag (for handlers writing
    # elsewhere); under the cell, the [mesh ranks] prefix says it, and ranks fold.
    folder = logs.Folder(window=10)
    for rank in (0, 1):
        folder.add([0, 0, "h", f"p/{rank}", "stderr", "m", rank, None,
                    f"[actor=train.Trainer m{{'gpus': {rank}/2}}] WARNING loss is nan", 2], 0.0)
    assert [str(line) for line in folder.take()] == ["[m 0-1] WARNING loss is nan"]


def test_a_rank_scheduled_late_still_joins_a_line_the_others_printed():
    # A loaded machine ran rank 1 half a second after ranks 0, 2 and 3 (seen in CI):
    # the line two ranks already share waits for the rest, up to FOLD_HOLD_S.
    folder = logs.Folder()

    def line(rank, text, at):
        folder.add([0, 0, "h", f"p/{rank}", "stdout", "m", rank, "c:1", text, 4], at)

    for rank, at in [(0, 0.0), (2, 0.01), (3, 0.02)]:
        line(rank, "hello", at)
    line(0, "only rank 0", 0.03)
    assert folder.take(0.4) == []  # held: three of four ranks printed it
    line(1, "hello", 0.5)
    # Complete: shown at once, then rank 0's next line (due, it waited behind it).
    assert [str(g) for g in folder.take(0.5)] == ["[m 0-3] hello", "[m 0] only rank 0"]
    # A line only one rank printed waits the short window, and a shared one no longer
    # than the hold.
    line(2, "alone", 1.0)
    assert [str(g) for g in folder.take(1.0 + logs.FOLD_WINDOW_S)] == ["[m 2] alone"]
    line(0, "most", 2.0)
    line(1, "most", 2.0)
    assert folder.take(2.0 + logs.FOLD_WINDOW_S) == []
    assert [str(g) for g in folder.take(2.0 + logs.FOLD_HOLD_S)] == ["[m 0-1] most"]


def test_a_group_shown_before_a_late_ranks_line_does_not_split_the_calls_after_it():
    # One call of a loop ran ranks 2-3 (one host) past the hold: its lines show as two
    # groups, rightly. Their late lines must count as ranks 2-3's first printing, not
    # start their counts again: every call after it (all ranks within milliseconds)
    # showed '[gen 0-1,4-5] sampling done' and '[gen 2-3] sampling done'.
    folder = logs.Folder()

    def call(i, ranks, at):
        for rank in ranks:
            folder.add([0, 0, "h", f"p/{rank}", "stdout", "gen", rank, "c:1", f"generated batch {i}", 6], at)
            folder.add([0, 0, "h", f"p/{rank}", "stdout", "gen", rank, "c:1", "sampling done", 6], at)

    call(0, (0, 1, 4, 5), 0.0)
    assert [str(g) for g in folder.take(logs.FOLD_HOLD_S)] == [
        "[gen 0-1,4-5] generated batch 0", "[gen 0-1,4-5] sampling done"]
    call(0, (2, 3), 1.5)
    for i in range(1, 4):
        call(i, range(6), 1.5 + i / 100)
    assert [str(g) for g in folder.take()] == [
        "[gen 2-3] generated batch 0", "[gen 2-3] sampling done",
        *(f"[gen 0-5] {text}" for i in range(1, 4) for text in (f"generated batch {i}", "sampling done"))]


def test_counts_of_texts_some_ranks_never_print_are_forgotten():
    # One rank of four prints a line of its own each call (a numbered flood): its counts
    # can never even out across the mesh, and are dropped FOLD_FORGET_S after its last.
    folder = logs.Folder()
    for i in range(1000):
        folder.add([0, 0, "h", "p/3", "stdout", "m", 3, "c:1", f"line {i}", 4], i / 1000)
    assert len(folder.take(1.0 + logs.FOLD_WINDOW_S)) == 1000
    folder.add([0, 0, "h", "p/3", "stdout", "m", 3, "c:1", "later", 4], 2.0 + logs.FOLD_FORGET_S)
    folder.take(2.0 + logs.FOLD_FORGET_S)
    assert len(folder._printed) == 1  # "later" only


def test_stored_lines_cut_in_the_middle_of_a_call_fold_from_the_newest():
    # A tail (or the store's ring) that starts after rank 0's line of a call: the
    # calls after it still fold, and the last one shows with both ranks.
    records = [[0, 0, "h", "p/1", "stdout", "t", 1, None, "x", 2]]
    records += [[0, 0, "h", f"p/{rank}", "stdout", "t", rank, None, "x", 2] for _ in range(2) for rank in (0, 1)]
    assert [str(g) for g in logs.fold_records(records)] == ["[t 1] x", "[t 0-1] x", "[t 0-1] x"]
    assert [str(g) for g in logs.tail_shown(lambda n: records[-n:], 1)] == ["[t 0-1] x"]


def test_a_flood_of_100k_lines_loses_nothing_and_leaves_the_cluster_healthy(cluster, printers, shown):
    assert printers.slice(gpus=3).numbered.call_one(100_000).get() == 100_000
    assert cluster.flush_logs(timeout=60)
    assert len(cluster.logs(mesh="printers", grep="^r3 line ")) == 100_000
    assert printers.say.call(["still here"]).get().values() == [0, 1, 2, 3]


def test_a_line_without_newline_and_a_threads_lines_belong_to_the_call(cluster, printers, shown):
    printers.slice(gpus=2).partial.call_one("done, no newline").get()
    printers.slice(gpus=1).in_thread.call_one("from a thread of the actor").get()
    assert cluster.flush_logs()
    assert shown.lines == ["stdout: [printers 2] done, no newline", "stdout: [printers 1] from a thread of the actor"]


def test_stopping_procs_leaves_nothing_on_their_stderr(cluster, host):
    # A proc's SIGTERM handler once set a signal handler off the main thread: every
    # stopped proc printed a traceback under the cell that stopped it.
    procs = host.spawn_procs(per_host={"gpus": 2}, name="quiet")
    procs.spawn("printers", Printer).say.call(["before the stop"]).get()
    procs.stop()
    assert cluster.flush_logs()
    assert len(cluster.logs(mesh="printers", grep="before the stop")) == 2
    assert [r["text"] for r in cluster.logs(mesh="quiet", stream="stderr")] == []


def test_a_flush_returns_only_once_the_lines_the_receiver_thread_took_are_shown():
    # The receiver thread takes the lines that are due off the folder, then shows them:
    # a flush (a script's exit, a cell's end) that found the folder empty in between
    # returned while they were still unshown, and the script exited without them.
    lines = logs.LogLines()
    shown: list[str] = []
    showing = threading.Event()

    def slow_sink(batch):  # a terminal slower than the flush
        showing.set()
        threading.Event().wait(0.5)
        shown.extend(str(line) for line in batch)

    lines.sink = slow_sink
    lines.add("c", 1, [[1, 0, "h", "p/0", "stdout", "m", 0, "me:", "last words", 1]])
    receiver = threading.Thread(target=lines.emit_due, args=(float("inf"),))
    receiver.start()
    assert showing.wait(10)
    assert lines.wait_for("c", 1, timeout=5)
    assert shown == ["[m 0] last words"]
    receiver.join()


RETAINED_TALKER = textwrap.dedent("""
    import sys
    import monarch_nb
    from monarch_nb.actor import Actor, endpoint

    class Talker(Actor):
        @endpoint
        def talk(self, call, n):
            for i in range(n):
                print(f"call {call} line {i}")  # no flush: the proc's stdio flushes

    cluster = monarch_nb.connect(sys.argv[1])
    talkers = cluster.host_mesh().spawn_procs(per_host={"gpus": 2}, name="talk").spawn("talkers", Talker)
    for call in range(3):
        talkers.talk.call(call, 20).get()
""")


@pytest.fixture
def retained_cluster():
    """A retained cluster started by the command line; stopped afterwards, leaving nothing."""
    name = "lostlines"
    out = subprocess.run([sys.executable, "-m", "monarch_nb.cli", "cluster", "start", name],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    yield name
    path = cluster_dir.cluster_path(name)
    subprocess.run([sys.executable, "-m", "monarch_nb.cli", "cluster", "stop", name], capture_output=True, timeout=120)
    assert wait_until(lambda: not cluster_processes(path), 15), cluster_processes(path)


def test_a_script_on_a_retained_cluster_shows_every_line_of_its_calls_before_it_exits(retained_cluster):
    # A script that connects, calls and exits at once: its exit flush must show the lines
    # of its last call that are still on their way. The race lost 1 run in 5-10, more
    # under load: several runs make it show.
    expected = sorted((rank, f"call {call} line {i}") for call in range(3) for i in range(20) for rank in (0, 1))
    for run in range(8):
        out = subprocess.run([sys.executable, "-c", RETAINED_TALKER, retained_cluster],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        shown = [line.partition("[talkers ")[2].partition("] ") for line in out.stdout.splitlines()]
        got = sorted((rank, text) for ranks, _, text in shown for rank in parse_ranks(ranks))  # folded or not
        assert got == expected, f"run {run}: {len(got)} of {len(expected)} lines:\n{out.stdout}"


def test_a_flush_that_a_stalled_host_agent_did_not_answer_says_so(capsys):
    # The hub's flush waits 2 s for each agent, then went on without a word: the cell
    # ended, and that host's lines came after it although the docs say they come first.
    own = Cluster.start_ephemeral()
    agent = own.info()["hosts"][0]["pid"]
    try:
        own.host_mesh().spawn_procs(per_host={"gpus": 1}).spawn("stalled", Printer).say.call(["hi"]).get()
        assert own.flush_logs()
        os.kill(agent, signal.SIGSTOP)
        try:
            assert not own.flush_logs(timeout=10)
        finally:
            os.kill(agent, signal.SIGCONT)
        assert "may show later: the host agent did not answer the flush in time" in capsys.readouterr().err
    finally:
        own.stop()
