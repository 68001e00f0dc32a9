"""The monarch kernel and %monarch magics, in real kernels: output under the right
cell, %%monarch exec, usage errors, interrupts, logs after a restart."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from monarch_nb import cluster_dir

from conftest import cluster_processes, pids_alive, wait_until
from kernels import TESTS, CellError, Kernel

TALKER = textwrap.dedent("""
    import time
    from monarch_nb.actor import Actor, endpoint, current_rank

    class Talker(Actor):
        @endpoint
        def talk(self, n):
            for i in range(n):
                print(f"step {i}")
            print("rank", current_rank().rank)
            return current_rank().rank

        @endpoint
        def slow(self, seconds):
            print("first")
            time.sleep(seconds)
            print("second")

        @endpoint
        def later(self, seconds):
            time.sleep(seconds)
            print("printed later")

        @endpoint
        def spin(self, seconds):  # like a training loop: Python code between short waits
            end = time.time() + seconds
            while time.time() < end:
                time.sleep(0.01)

        @endpoint
        def say_followed(self):
            print("followed")

        @endpoint
        def pid(self):
            import os
            return os.getpid()

        @endpoint
        def fail(self):
            raise ValueError("bad batch")

        @endpoint
        def flood(self, n):
            for i in range(n):
                print(f"flood {i}")
""")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monarch_nb.cli", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def kernel():
    """A monarch kernel started while the retained cluster `default` runs."""
    assert _cli("cluster", "start", "default").returncode == 0
    k = Kernel("monarch")
    yield k
    k.shutdown()
    _cli("cluster", "stop", "default")
    path = cluster_dir.cluster_path("default")
    assert wait_until(lambda: not cluster_processes(path), 15)
    assert not path.exists()


@pytest.fixture(scope="module")
def talkers(kernel):
    first = kernel.run("1 + 1")
    assert "monarch: connected to cluster 'default'" in first
    out = kernel.run("%monarch procs workers --per-host gpus=4\n" + TALKER + "%monarch spawn talkers Talker")
    assert "talkers = <ActorMesh 'talkers'" in out
    return "talkers"


def test_call_output_is_shown_under_the_calling_cell_prefixed_and_folded(kernel, talkers):
    out = kernel.run("talkers.talk.call(2).get()")
    lines = out.splitlines()
    assert lines[:2] == ["[talkers 0-3] step 0", "[talkers 0-3] step 1"]
    assert sorted(lines[2:6]) == [f"[talkers {r}] rank {r}" for r in range(4)]
    assert "ValueMesh" in out  # then the cell's result


def test_lines_of_a_cluster_the_cell_started_itself_are_shown_before_the_cell_finishes(kernel, talkers):
    # Only the %monarch cluster's lines were waited for at a cell's end: those of a
    # Cluster.start_ephemeral() the cell made came after it had finished.
    out = kernel.run(textwrap.dedent("""
        import monarch_nb

        class Loud(Actor):
            @endpoint
            def shout(self, n):
                for i in range(n):
                    print(f"line {i} " + "x" * 2000)

        own = monarch_nb.Cluster.start_ephemeral()
        loud = own.host_mesh().spawn_procs(per_host={"gpus": 1}).spawn("loud", Loud)
        loud.shout.call(500).get()
    """))
    try:
        assert f"[loud 0] line 499 {'x' * 2000}" in out, out[-300:]
    finally:
        kernel.run("own.stop()")


def test_output_streams_while_the_cell_is_still_running(kernel, talkers):
    msg_id = kernel.execute("talkers.slow.call(3).get()")
    assert kernel.wait_for(lambda: "[talkers 0-3] first" in kernel.text(msg_id), 20)
    assert "second" not in kernel.text(msg_id)  # the cell is still waiting on the call
    assert kernel.finish(msg_id)["status"] == "ok"
    assert "[talkers 0-3] second" in kernel.text(msg_id)


def test_output_of_a_finished_cell_lands_under_that_cell(kernel, talkers):
    early = kernel.execute("talkers.later.broadcast(1.0)")
    assert kernel.finish(early)["status"] == "ok"
    busy = kernel.execute("import time\ntime.sleep(3)")
    assert kernel.wait_for(lambda: "[talkers 0-3] printed later" in kernel.text(early), 20)
    kernel.finish(busy)
    assert "printed later" not in kernel.text(busy)


def test_actor_lines_never_split_the_cells_own_lines(kernel, talkers):
    # print() writes its parts one by one; actor lines streaming in meanwhile landed
    # between them ("own 2 [w 0-1] chatter" then "v2 end": 268 of 600 lines, issue 23).
    msg_id = kernel.execute(textwrap.dedent("""
        import time

        class Slow:  # print() turns it into text between writing "own i " and "v2"
            def __str__(self):
                time.sleep(0.001)
                return "v2"

        pending = talkers.talk.call(150)  # its lines stream in while the cell prints
        for i in range(1500):
            print("own", i, Slow(), "end")
        pending.get()
    """))
    assert kernel.finish(msg_id)["status"] == "ok"
    lines = kernel.text(msg_id).splitlines()
    own = [line for line in lines if "own" in line]
    assert len(own) == 1500 and all(re.fullmatch(r"own \d+ v2 end", line) for line in own), \
        [line for line in own if not re.fullmatch(r"own \d+ v2 end", line)][:5]
    assert sum(line.startswith("[talkers") and "step" in line for line in lines) >= 150  # folded per step


def test_a_flood_is_capped_in_the_cell_and_kept_in_the_store(kernel, talkers):
    msg_id = kernel.execute("talkers.slice(gpus=0).flood.call_one(3000).get()")
    assert kernel.finish(msg_id)["status"] == "ok"
    shown = [line for line in kernel.text(msg_id).splitlines() if "flood" in line]
    assert shown == [f"[talkers 0] flood {i}" for i in range(1000)]
    assert "2000 more lines from talkers are not shown here" in kernel.text(msg_id, "stderr")
    # and the command the hint gives shows exactly those held back (it said --tail 200)
    assert "see them with %monarch logs talkers --tail 2000" in kernel.text(msg_id, "stderr")
    held_back = [line for line in kernel.run("%monarch logs talkers --tail 2000").splitlines() if "flood" in line]
    assert len(held_back) == 2000 and held_back[0].endswith("flood 1000") and held_back[-1].endswith("flood 2999")
    stored = kernel.run("import monarch_nb\nprint(len(monarch_nb.connect().logs(mesh='talkers', grep='^flood ')))")
    assert stored.strip() == "3000"


def test_exec_runs_the_cell_in_every_proc_with_a_persistent_namespace(kernel, talkers):
    out = kernel.run("%%monarch exec workers\nimport os\nvalue = 6 * 7\nprint('hello', value)\nvalue")
    assert out.splitlines() == ["[workers.exec 0-3] hello 42", "[workers.exec 0-3] 42"]
    assert kernel.run("print(type(_).__name__, list(_.values()))").strip() == "ValueMesh [42, 42, 42, 42]"
    out = kernel.run("%%monarch exec workers --ranks 1,3\nvalue + int(os.environ.get('X', 1))")
    assert out.splitlines() == ["[workers.exec 1,3] 43"]
    out = kernel.run("%%monarch exec talkers\nos.getpid()")  # an actor mesh: the procs under it
    assert len(out.splitlines()) == 4


def test_exec_failure_shows_each_ranks_traceback_and_fails_the_cell(kernel, talkers):
    msg_id = kernel.execute("%%monarch exec workers\nfrom monarch_nb.actor import current_rank\n"
                            "if current_rank().rank % 2:\n    raise ValueError('odd rank')\n'fine'")
    reply = kernel.finish(msg_id)
    assert reply["status"] == "error" and reply["ename"] == "ExecFailed"
    assert "exec failed on rank(s) 1,3 of workers" in reply["evalue"]
    err = kernel.text(msg_id, "stderr")
    assert err.startswith("[workers.exec 1,3] Traceback") and "ValueError: odd rank" in err
    assert kernel.run("%%monarch exec workers\nvalue").splitlines() == ["[workers.exec 0-3] 42"]


def test_kernel_interrupt_during_exec_interrupts_the_ranks_and_returns_the_prompt(kernel, talkers):
    msg_id = kernel.execute("%%monarch exec workers\nimport time\nprint('sleeping')\ntime.sleep(60)")
    assert kernel.wait_for(lambda: "sleeping" in kernel.text(msg_id), 20)
    kernel.km.interrupt_kernel()
    reply = kernel.finish(msg_id, timeout=20)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    # The ranks were interrupted too: they answer at once.
    assert kernel.run("%%monarch exec workers\n'awake'", timeout=20).splitlines() == ["[workers.exec 0-3] 'awake'"]


def test_interrupt_magic_stops_a_running_endpoint(kernel, talkers):
    kernel.run("fut = talkers.spin.call(60)")
    kernel.run("%monarch interrupt talkers")
    out = kernel.run("try:\n    fut.get(timeout=20)\nexcept Exception as e:\n"
                     "    print(type(e).__name__, type(e.exception).__name__, len(e.failures))")
    assert out.strip().endswith("ActorError KeyboardInterrupt 4")


@pytest.mark.parametrize("line, message", [
    ("%monarch logs nosuch --ranks 0-", "bad rank spec '0-'"),
    ("%monarch interrupt nosuch", "no mesh 'nosuch'"),
    ("%monarch logs nosuch", "no mesh 'nosuch' and no lines of it in the store (meshes: "),
    ("%%monarch exec workers --ranks gpu=0\nx = 1", "'gpu' is not a dimension of workers (dimensions: "),
    ("%monarch spawn x NoSuchClass --procs workers", "class 'NoSuchClass' is not defined"),
    ("%monarch procs p --per-host gpus", "write LABEL=SIZE"),
    ("%monarch frobnicate", "invalid choice: 'frobnicate'"),
    ("%monarch exec workers", "exec is a cell magic"),
    ("%monarch logs --since -5", "--since -5: give how many seconds ago, a number > 0"),  # (it showed every line)
])
def test_mistakes_raise_a_one_line_usage_error(kernel, talkers, line, message):
    with pytest.raises(CellError) as info:
        kernel.run(line)
    assert info.value.ename == "UsageError" and message in info.value.evalue
    assert "\n" not in info.value.evalue


def test_not_connected_is_a_usage_error_in_a_stock_kernel():
    plain = Kernel("python3", env={"MONARCH_NB_CLUSTER": "none"})
    try:
        with pytest.raises(CellError) as info:
            plain.run("%load_ext monarch_nb\n%monarch status")
        assert info.value.ename == "UsageError" and "not connected to a cluster" in info.value.evalue
    finally:
        plain.shutdown()


def test_a_call_that_takes_long_shows_a_progress_bar_counting_ranks(kernel, talkers):
    msg_id = kernel.execute("talkers.slow.call(1.5).get()")
    assert kernel.finish(msg_id)["status"] == "ok"
    widget_states = [m["content"]["data"]["state"] for m in kernel.outputs[msg_id]
                     if m["msg_type"] == "comm_open" and "state" in m["content"].get("data", {})]
    updates = [m["content"]["data"]["state"] for m in kernel.outputs[msg_id] if m["msg_type"] == "comm_msg"]
    labels = [s.get("value") for s in widget_states + updates if isinstance(s.get("value"), str)]
    assert labels[0] == "talkers.slow: 0/4 ranks done"
    assert labels[-1].startswith("talkers.slow: 4/4 ranks done in ")
    quick = kernel.execute("talkers.talk.call(0).get()")  # answers within the second: no bar
    kernel.finish(quick)
    assert not [m for m in kernel.outputs[quick] if m["msg_type"] == "comm_open"]


def test_logs_follow_shows_new_lines_until_interrupted_and_the_cli_reads_the_store(kernel, talkers):
    msg_id = kernel.execute("%monarch logs talkers --grep '^followed' --tail 5 --follow")
    script = ("import monarch_nb\nm = monarch_nb.connect('default').actor_meshes['talkers']\n"
              "m.slice(gpus=1).say_followed.call_one().get()")
    # The kernel is busy following: another client makes the line.
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, cwd=str(TESTS))
    assert kernel.wait_for(lambda: "[talkers 1] followed" in kernel.text(msg_id), 20)
    kernel.km.interrupt_kernel()
    assert kernel.finish(msg_id, timeout=20)["status"] == "ok"  # Ctrl-C just ends the follow
    out = _cli("logs", "default", "talkers", "--grep", "^followed", "--tail", "5")
    assert out.returncode == 0 and out.stdout.strip() == "[talkers 1] followed"


def test_the_cli_and_the_magic_take_the_same_fold_switch(kernel, talkers):
    # `monarch-nb logs ... --fold off` was refused ("unrecognized arguments").
    kernel.run("talkers.say_followed.call().get()")  # "followed" from every rank
    # --tail counts lines shown: the last one folds the four ranks' lines
    folded = _cli("logs", "default", "talkers", "--grep", "^followed", "--tail", "1")
    unfolded = _cli("logs", "default", "talkers", "--grep", "^followed", "--tail", "4", "--fold", "off")
    assert folded.returncode == 0 and folded.stdout.strip() == "[talkers 0-3] followed", folded.stderr
    assert unfolded.returncode == 0, unfolded.stderr
    assert sorted(unfolded.stdout.splitlines()) == [f"[talkers {r}] followed" for r in range(4)]
    # The magic's --tail counts lines shown too (it showed '[talkers 3] followed', as if
    # only rank 3 had printed it).
    out = kernel.run("%monarch logs talkers --grep '^followed' --tail 1")
    assert [line for line in out.splitlines() if line.startswith("[")] == ["[talkers 0-3] followed"], out
    # With a query, --fold is that query's: it was taken as the switch of the output under
    # cells, which it turned off for good, and the query was dropped.
    out = kernel.run("%monarch logs --grep '^followed' --tail 4 --fold off")
    assert sorted(line for line in out.splitlines() if line.startswith("[")) == [
        f"[talkers {r}] followed" for r in range(4)], out
    out = kernel.run("talkers.say_followed.call().get()")
    assert "[talkers 0-3] followed" in out.splitlines(), out
    # Alone, it is that switch.
    assert "folding of the output under cells off" in kernel.run("%monarch logs --fold off")
    out = kernel.run("talkers.say_followed.call().get()")
    kernel.run("%monarch logs --fold on")
    assert sorted(line for line in out.splitlines() if line.startswith("[")) == [
        f"[talkers {r}] followed" for r in range(4)], out


def test_spawn_arguments_are_python_call_arguments(kernel, talkers):
    kernel.run("from sample_actors import Counter")
    out = kernel.run("%monarch spawn c Counter --procs workers -- start=len('a b, c')\nprint(c.get.call().get().values())")
    assert out.splitlines()[-1] == "[6, 6, 6, 6]"
    with pytest.raises(CellError) as info:
        kernel.run("%monarch spawn c2 Counter --procs workers -- start=1, start=2")
    assert info.value.ename == "UsageError" and "'start' is given twice" in info.value.evalue


def test_exec_tracebacks_show_the_cells_frames_only(kernel, talkers):
    msg_id = kernel.execute("%%monarch exec workers\nx = 1\n1 / 0")
    kernel.finish(msg_id)
    assert kernel.text(msg_id, "stderr").splitlines()[:3] == [
        "[workers.exec 0-3] Traceback (most recent call last):",
        '  File "<%%monarch exec workers>", line 2, in <module>', "ZeroDivisionError: division by zero"]


def test_sync_reports_per_proc_mesh_what_it_checked_and_reloaded(kernel, talkers):
    out = kernel.run("%monarch sync talkers")
    assert re.fullmatch(r"monarch: \S+: \d+ \.py file\(s\) checked, 0 sent; reloaded: nothing changed", out.strip()), out
    assert "reloaded:" in kernel.run("%monarch sync")  # every proc mesh of the cluster


def test_help_lists_every_subcommand(kernel, talkers):
    out = kernel.run("%monarch help")
    for usage in ("%monarch start [NAME]", "%monarch procs VAR", "%monarch spawn VAR CLASS", "%monarch logs [MESH]",
                  "%monarch interrupt MESH", "%%monarch exec MESH", "%monarch status", "%monarch sync [MESH]"):
        assert usage in out


def test_a_missing_argument_names_the_subcommand_and_shows_its_usage():
    from IPython.core.error import UsageError

    from monarch_nb.notebook.magics import PARSER

    with pytest.raises(UsageError) as info:
        PARSER.parse_args(["procs"])
    assert str(info.value) == ("%monarch procs: the following arguments are required: var; "
                               "usage: %monarch procs [--per-host PER_HOST] [--name NAME] var")


def test_a_broadcast_failure_shows_in_the_running_cell_and_kills_the_actor(kernel, talkers):
    kernel.run("%monarch spawn brittle Talker --procs workers")
    # The waiting call is made first, on ranks the failure spares: made after it, on a
    # loaded machine the failure could already be known and that call would raise it.
    msg_id = kernel.execute("busy = brittle.slice(gpus=slice(0, 2)).spin.call(3)\n"
                            "brittle.slice(gpus=2).fail.broadcast()\nbusy.get()")
    assert kernel.wait_for(lambda: "[monarch] unhandled failure" in kernel.text(msg_id, "stderr"), 10)
    assert kernel.finish(msg_id)["status"] == "ok"
    assert "brittle rank 2: broadcast fail raised ValueError: bad batch" in kernel.text(msg_id, "stderr")
    for _ in range(2):  # rank 2 is dead (Monarch's rule): every call to it raises
        with pytest.raises(CellError) as info:
            kernel.run("brittle.talk.call(0).get()")
        assert info.value.ename == "SupervisionError" and "bad batch" in info.value.evalue
    assert kernel.run("brittle.slice(gpus=slice(0, 2)).talk.call(0).get().values()").strip().splitlines()[-1] == "[0, 1]"


def test_a_broadcast_failure_of_a_surviving_actor_shows_and_the_next_call_raises_it(kernel, talkers):
    kernel.run("class Sturdy(Talker):\n    survive_broadcast_errors = True\n\n"
               "%monarch spawn sturdy Sturdy --procs workers")
    msg_id = kernel.execute("busy = sturdy.slice(gpus=slice(0, 2)).spin.call(3)\n"
                            "sturdy.slice(gpus=2).fail.broadcast()\nbusy.get()")
    assert kernel.wait_for(lambda: "[monarch] unhandled failure" in kernel.text(msg_id, "stderr"), 10)
    assert kernel.finish(msg_id)["status"] == "ok"
    notice = kernel.text(msg_id, "stderr")
    assert "sturdy rank 2: broadcast fail raised ValueError: bad batch" in notice
    assert "the next call on sturdy raises it" in notice
    with pytest.raises(CellError) as info:
        kernel.run("sturdy.talk.call(0).get()")
    assert info.value.ename == "SupervisionError" and "bad batch" in info.value.evalue
    assert kernel.run("sturdy.talk.call(0).get().values()").strip().splitlines()[-1] == "[0, 1, 2, 3]"


def test_a_proc_dying_between_cells_is_shown_at_the_start_of_the_next_cell(kernel, talkers):
    pid = int(kernel.run("%monarch procs victims --per-host gpus=1\n%monarch spawn victim Talker --procs victims\n"
                         "victim.pid.call_one().get()").strip().splitlines()[-1])
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not pids_alive([pid]), 10)
    # The news reaches the kernel between cells: the first cell to start after it shows it.
    cells = []

    def noticed():
        msg_id = kernel.execute("'next cell'")
        assert kernel.finish(msg_id, timeout=30)["status"] == "ok"
        cells.append(kernel.text(msg_id, "stderr"))
        return "[monarch] unhandled failure" in cells[-1]

    assert wait_until(noticed, 15)
    assert "[monarch] unhandled failure: proc victims/0" in cells[-1] and "killed by SIGKILL" in cells[-1]
    assert kernel.run("victims.stop()\n'stopped'", timeout=30)


def test_a_failure_the_cells_own_call_raised_gets_no_banner_then_or_later(kernel, talkers):
    kernel.run("%monarch procs survivors --per-host gpus=1\n%monarch spawn survivor Talker --procs survivors\n"
               "import monarch_nb.actor\nfaults = []\nmonarch_nb.actor.unhandled_fault_hook = faults.append")
    msg_id = kernel.execute(
        "import os, signal\nfrom monarch_nb.actor import SupervisionError\n"
        "pid = survivor.pid.call_one().get()\nwaiting = survivor.spin.call_one(60)\nos.kill(pid, signal.SIGKILL)\n"
        "try:\n    waiting.get(timeout=30)\nexcept SupervisionError:\n    print('handled')")
    assert kernel.finish(msg_id, timeout=40)["status"] == "ok"
    assert "handled" in kernel.text(msg_id)
    # Cells run until the failure has reached the kernel's hooks (the banner's, then
    # Monarch's), and one more: none of them, nor the cell that handled it, shows a banner.
    cells = [msg_id]

    def hooks_heard() -> bool:
        cells.append(kernel.execute("len(faults)"))
        assert kernel.finish(cells[-1], timeout=30)["status"] == "ok"
        return kernel.text(cells[-1]).strip().splitlines()[-1] == "1"

    assert wait_until(hooks_heard, 15)
    cells.append(kernel.execute("'later'"))
    assert kernel.finish(cells[-1], timeout=30)["status"] == "ok"
    assert not [kernel.text(cell, "stderr") for cell in cells if "unhandled failure" in kernel.text(cell, "stderr")]
    kernel.run("monarch_nb.actor.unhandled_fault_hook = lambda failure: None\nsurvivors.stop()\n'stopped'",
               timeout=30)


def test_a_remote_traceback_shows_the_cells_source_and_no_client_frames(kernel, talkers):
    with pytest.raises(CellError) as failed:
        kernel.run("talkers.fail.call().get()")
    shown = re.sub(r"\x1b\[[0-9;]*m", "", str(failed.value))
    assert 'raise ValueError("bad batch")' in shown  # the line in the cell, under the remote frame
    assert "future.py" not in shown and "raise self._error" not in shown
    # Cells named as IPython names them, the remote frame's too, not by their hashed file names.
    shown = shown[len(f"{failed.value.ename}: {failed.value.evalue}\n"):]  # the traceback shown
    assert re.search(r"Cell In\[\d+\], line 1, in <module>", shown) and re.search(
        r"Cell In\[\d+\], line \d+, in fail", shown) and "ipykernel_" not in shown, shown


def test_a_failure_shown_under_the_cell_is_not_said_again_by_the_error_its_call_raises(kernel, talkers):
    kernel.run("%monarch procs gone --per-host gpus=1\n%monarch spawn goner Talker --procs gone\n"
               "import monarch_nb.actor\nheard = []\nmonarch_nb.actor.unhandled_fault_hook = heard.append")
    # The death is noticed while the cell runs (no call of it is waiting), then its call raises it.
    msg_id = kernel.execute(
        "import os, signal, time\nos.kill(goner.pid.call_one().get(), signal.SIGKILL)\n"
        "deadline = time.monotonic() + 60\nwhile not heard and time.monotonic() < deadline:\n    time.sleep(0.05)\n"
        "goner.pid.call_one().get()")
    assert kernel.finish(msg_id, timeout=90)["status"] == "error"
    notice = kernel.text(msg_id, "stderr")
    assert "[monarch] unhandled failure: proc gone/0" in notice, notice
    why = notice.split("[monarch] unhandled failure: ", 1)[1].splitlines()[0]
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(
        line for m in kernel.outputs[msg_id] if m["msg_type"] == "error" for line in m["content"]["traceback"]))
    assert "SupervisionError: Endpoint call goner.pid() failed" in shown, shown
    assert why not in shown and "the failure shown above" in shown, shown
    kernel.run("monarch_nb.actor.unhandled_fault_hook = lambda failure: None\ngone.stop()\n'stopped'", timeout=30)


def test_a_value_mesh_shows_as_a_table_by_point_and_a_short_line(kernel, talkers):
    msg_id = kernel.execute("talkers.talk.call(0).get()")
    kernel.finish(msg_id)
    data = next(m["content"]["data"] for m in kernel.outputs[msg_id] if m["msg_type"] == "execute_result")
    assert "<th>gpus</th><th>value</th>" in data["text/html"] and data["text/html"].count("<tr>") == 5
    assert data["text/plain"].startswith("ValueMesh({'gpus': 4}, {{'gpus': 0/4}: 0,")
    long = kernel.run("from monarch_nb.actor import ValueMesh, Extent\nValueMesh(Extent({'r': 2}), ['x' * 5000, 1])")
    assert len(long) < 200


def test_status_in_a_kernel_has_plain_text_without_ansi_codes_and_no_header_that_goes_stale(kernel, talkers):
    msg_id = kernel.execute("%monarch status")
    assert kernel.finish(msg_id)["status"] == "ok"
    plain = [m["content"]["data"]["text/plain"] for m in kernel.outputs[msg_id] if m["msg_type"] == "display_data"]
    plain += [m["content"]["text"] for m in kernel.outputs[msg_id] if m["msg_type"] == "stream"]
    assert plain and not any("\x1b[" in text for text in plain)
    assert not any("procs alive" in text for text in plain)  # the live widget's own summary says it
    assert any("talkers" in text for text in plain)  # the tree's plain fallback


def _interrupt_cell(kernel: Kernel, folder, code: str) -> dict:
    """Run ``code``, Ctrl-C it once its last statement waits, and return its
    execute_reply. ``code``'s last statement starts its wait with ``{mark}`` (``{mark}
    or f.get()``): that touches a file in ``folder``, in the same statement as the wait.
    A 'waiting' line printed before was no sign: on a loaded machine the interrupt landed
    while print's flush still waited on ipykernel's IO thread (CI), outside the wait."""
    marker = folder / "waiting"
    msg_id = kernel.execute("import pathlib\n" + code.format(mark=f"pathlib.Path({str(marker)!r}).touch()"))
    assert kernel.wait_for(marker.exists, 20)
    kernel.km.interrupt_kernel()
    return kernel.finish(msg_id, timeout=30)


def test_ctrl_c_while_waiting_on_calls_interrupts_them_on_the_ranks_and_the_next_call_runs_at_once(
        kernel, talkers, tmp_path):
    reply = _interrupt_cell(kernel, tmp_path, "f = talkers.spin.call(300)\nqueued = talkers.spin.call(300)\n"
                                              "{mark} or f.get()")
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    # One short line naming the calls, not a traceback through the client's wait.
    assert reply["traceback"] == ["KeyboardInterrupt: interrupted talkers.spin (ranks 0-3) on the cluster"]
    assert reply["evalue"] == "interrupted talkers.spin (ranks 0-3) on the cluster"  # what nbclient's error shows
    # Neither the running call nor the one queued behind it goes on: the next call is
    # answered now, not after 600 s of spinning.
    assert kernel.run("talkers.talk.call(0).get(timeout=30).values()", timeout=40).strip().splitlines()[-1] == "[0, 1, 2, 3]"
    out = kernel.run("for g in (f, queued):\n    try:\n        g.get(timeout=30)\n    except Exception as e:\n"
                     "        print(type(e).__name__, type(e.exception).__name__)")
    assert out.split("\n")[:2] == ["ActorError KeyboardInterrupt"] * 2


def test_ctrl_c_while_waiting_on_calls_an_earlier_cell_made_interrupts_those(kernel, talkers, tmp_path):
    # Calls made in one cell and waited on in the next: a common notebook pattern, whose
    # Ctrl-C left them spinning (only the running cell's own calls were interrupted).
    assert kernel.run("fs = [talkers.spin.call(300)]\nprint('sent')").strip() == "sent"
    reply = _interrupt_cell(kernel, tmp_path, "{mark} or [f.get() for f in fs]")
    assert reply["traceback"] == ["KeyboardInterrupt: interrupted talkers.spin (ranks 0-3) on the cluster"]
    assert kernel.run("talkers.talk.call(0).get(timeout=30).values()", timeout=40).strip().splitlines()[-1] == "[0, 1, 2, 3]"


def test_ctrl_c_while_a_cell_awaits_calls_interrupts_them_at_once(kernel, talkers, tmp_path):
    # A top-level await: ipykernel cancels the cell on Ctrl-C, which it did only once the
    # call had ended (its SIGINT handler waited for the event loop to wake), and the calls
    # went on; now the cell ends with the interrupt's line and the next call runs at once.
    reply = _interrupt_cell(kernel, tmp_path, "res = {mark} or await talkers.spin.call(300)")
    assert reply["traceback"] == ["KeyboardInterrupt: interrupted talkers.spin (ranks 0-3) on the cluster"]
    assert reply["evalue"] == "interrupted talkers.spin (ranks 0-3) on the cluster"
    assert kernel.run("talkers.talk.call(0).get(timeout=30).values()", timeout=40).strip().splitlines()[-1] == "[0, 1, 2, 3]"


def test_ctrl_c_with_interrupt_remote_off_leaves_the_calls_running(kernel, talkers, tmp_path):
    assert kernel.run("%monarch config interrupt_remote off").strip() == "interrupt_remote off"
    try:
        reply = _interrupt_cell(kernel, tmp_path, "f = talkers.spin.call(8)\n{mark} or f.get()")
        assert reply["traceback"] == [
            "KeyboardInterrupt: talkers.spin (ranks 0-3) still running on the cluster "
            "(%monarch config interrupt_remote on: Ctrl-C interrupts them too)"]
        out = kernel.run("print(f.get(timeout=60).values())", timeout=70)  # ran to the end
        assert out.strip().splitlines()[-1] == "[None, None, None, None]"
    finally:
        kernel.run("%monarch config interrupt_remote on")


def test_ctrl_c_in_a_cell_without_calls_in_flight_shows_the_usual_traceback(kernel, tmp_path):
    # Interrupted once the cell is past its output: "waiting" shows while print's flush
    # still waits on ipykernel's IO thread, and an interrupt there (seen on a loaded
    # machine) lands outside the cell's own lines. The marker and the sleep are one
    # statement: IPython compiles a cell's last statement after running the others, and
    # an interrupt during that compile (seen in CI) is outside the cell's lines too.
    marker = tmp_path / "sleeping"
    msg_id = kernel.execute(f"import time, pathlib\nprint('waiting', flush=True)\n"
                            f"pathlib.Path({str(marker)!r}).touch() or time.sleep(60)")
    assert kernel.wait_for(lambda: marker.exists(), 20)
    kernel.km.interrupt_kernel()
    reply = kernel.finish(msg_id, timeout=30)
    assert reply["ename"] == "KeyboardInterrupt"
    assert "time.sleep(60)" in re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(reply["traceback"]))


# Last: the kernel restarts (later tests would not find the names defined before).
def test_logs_from_before_a_kernel_restart_are_queryable_after_it(kernel, talkers):
    kernel.run("talkers.talk.call(1).get()")
    kernel.restart()
    out = kernel.run("%monarch logs talkers --grep '^rank' --tail 4")
    assert "monarch: connected to cluster 'default'" in out  # reconnected at start
    assert sorted(line for line in out.splitlines() if line.startswith("[")) == [
        f"[talkers {r}] rank {r}" for r in range(4)]
    out = kernel.run("import monarch_nb\nmonarch_nb.connect().actor_meshes['talkers'].talk.call(0).get()")
    assert "ValueMesh" in out


def test_the_kernel_binds_the_cluster_it_connected_to_as_cluster(kernel, talkers):
    kernel.restart()
    out = kernel.run("cluster.actor_meshes['talkers'].talk.call(0).get(timeout=30).values()")
    assert "monarch: it is `cluster`; mesh handles: cluster.actor_meshes['" in out
    assert out.strip().splitlines()[-1] == "[0, 1, 2, 3]"


def test_loading_into_an_ipykernel_older_than_7_says_that_late_lines_go_astray():
    from monarch_nb.notebook import ipykernel_warning

    warning = ipykernel_warning("6.29.5")
    assert "ipykernel 6.29.5" in warning and "pip install 'ipykernel>=7'" in warning
    assert ipykernel_warning("7.0.1") == "" and ipykernel_warning("10.0") == ""
