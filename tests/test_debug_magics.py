"""%monarch break / %monarch debug in a real kernel on a retained cluster: a
breakpoint set on a class defined in a notebook cell, the live list, where with the
cell's source, eval across ranks, and paused ranks surviving a kernel restart."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from monarch_nb import cluster_dir

from conftest import cluster_processes, wait_until
from kernels import WORKER, CellError, Kernel

NAME = "dbg-magics"

STEPPER = textwrap.dedent("""\
    from monarch_nb.actor import Actor, endpoint, context

    class Stepper(Actor):
        @endpoint
        def work(self, x):
            y = x * 10 + context().actor_instance.rank.rank
            return y + 1

        @endpoint
        def halt(self, x):
            y = x + context().actor_instance.rank.rank
            breakpoint()
            return y
    """)  # line 6 of this cell: `y = x * 10 + ...`; line 13: after breakpoint() in halt


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monarch_nb.cli", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def kernel():
    assert _cli("cluster", "start", NAME).returncode == 0
    k = Kernel("python3")
    try:
        k.run(f"%load_ext monarch_nb\n%monarch connect {NAME}")
        yield k
    finally:
        k.shutdown()
        _cli("cluster", "stop", NAME)
    path = cluster_dir.cluster_path(NAME)
    assert wait_until(lambda: not cluster_processes(path), 15)


def test_break_on_a_notebook_class_then_list_where_eval_continue(kernel):
    kernel.run(STEPPER)
    kernel.run("%monarch procs workers --per-host gpus=4\n%monarch spawn steppers Stepper")
    out = kernel.run("%monarch break Stepper.work:6 steppers --ranks 1,3")
    assert "breakpoint 1 at " in out and ":6 (steppers ranks 1,3)" in out
    assert "Stepper.work" not in kernel.run("%monarch break --list") and ":6 (steppers ranks 1,3)" in kernel.run(
        "%monarch break --list")
    kernel.run("fut = steppers.work.call(2)\n"
               "import monarch_nb\nmonarch_nb.connect().debugger.wait_paused(2, 'steppers', timeout=60)")
    listed = kernel.run("%monarch debug")
    assert "2 paused" in listed
    rows = [line for line in listed.splitlines() if line.startswith("steppers")]
    # Named as IPython names the cell, not by its hashed file name (/tmp/ipykernel_PID/HASH.py)
    assert [row.split()[1] for row in rows] == ["1", "3"] and all(
        re.search(r"Cell In\[\d+\], line 6 +work", row) for row in rows), listed
    where = kernel.run("%monarch debug where steppers 3")
    assert re.search(r"#0 work at Cell In\[\d+\], line 6", where) and "y = x * 10 + context().actor_instance.rank.rank" in where  # the cell's own source
    assert kernel.run("%monarch debug eval steppers[1, 3] x * 100").strip() == "[steppers 1,3] 200"
    moved = kernel.run("%monarch debug next steppers[1]")
    assert re.match(r"\[steppers 1\] at Cell In\[\d+\], line 7 in work", moved), moved
    assert kernel.run("%monarch debug locals steppers 1").count("y = 21") == 1
    assert "cleared 1 breakpoint(s)" in kernel.run("%monarch break --clear")
    assert "continued steppers rank(s) 1,3" in kernel.run("%monarch debug continue steppers")
    with pytest.raises(CellError, match="not paused"):  # continued already: a clear no
        kernel.run("%monarch debug continue steppers[1]")
    assert kernel.run("print(list(fut.get(timeout=30).values()))").strip() == "[21, 22, 23, 24]"
    assert "no paused ranks" in kernel.run("%monarch debug")


def test_debug_eval_takes_ranks_written_with_spaces():
    # "t[0, 1] x" was cut at its first space: target "t[0,", expression "1] x".
    from monarch_nb.notebook.debug_magics import split_eval

    assert split_eval("trainers[0, 1] loss * 2") == ("trainers[0, 1]", "loss * 2")
    assert split_eval(" trainers  batch[0, 1] ") == ("trainers", "batch[0, 1]")
    assert split_eval("trainers[0-3]") == ("", "") == split_eval("trainers")  # a usage error


def test_mistakes_are_one_line_usage_errors(kernel):
    for line, message in [("%monarch debug eval steppers", "MESH[RANKS] EXPR"),
                          ("%monarch debug eval steppers[0] 1", "rank(s) 0 of 'steppers' are not paused"),
                          ("%monarch debug where steppers", "MESH RANK"),
                          ("%monarch debug fly", "unknown action 'fly'"),
                          ("%monarch break nowhere.py", "FILE:LINE"),
                          ("%monarch break Stepper.work:6 nomesh", "no actor mesh 'nomesh'")]:
        with pytest.raises(CellError) as e:
            kernel.run(line)
        assert e.value.ename == "UsageError" and message in e.value.evalue, (line, e.value.evalue)


def _debug_request(kernel, command: str, **arguments) -> dict:
    """A DAP request on the kernel's control channel, as JupyterLab's debugger sends it."""
    kernel.seq = getattr(kernel, "seq", 0) + 1
    msg = kernel.kc.session.msg("debug_request", {"seq": kernel.seq, "type": "request", "command": command,
                                                  "arguments": arguments})
    kernel.kc.control_channel.send(msg)
    while True:
        reply = kernel.kc.control_channel.get_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return reply["content"]


def _debug_events(kernel, event: str) -> list[dict]:
    return [m["content"] for msgs in list(kernel.outputs.values()) for m in msgs
            if m["msg_type"] == "debug_event" and m["content"].get("event") == event]


def test_jupyterlab_debugger_panel_drives_a_remote_rank(kernel):
    kernel.run("steppers.slice(gpus=1).halt.broadcast(5)\nimport monarch_nb\n"
               "monarch_nb.connect().debugger.wait_paused(1, 'steppers', timeout=60)")
    out = kernel.run("%monarch debug attach steppers 1 --jupyterlab")
    assert "this kernel's debugger now drives steppers rank 1" in out
    info = _debug_request(kernel, "debugInfo")["body"]
    assert info["isStarted"] and len(info["stoppedThreads"]) == 1
    assert _debug_request(kernel, "initialize", adapterID="python", clientID="jupyterlab")["success"]
    assert _debug_request(kernel, "attach")["success"]
    assert _debug_request(kernel, "configurationDone")["success"]
    assert kernel.wait_for(lambda: _debug_events(kernel, "stopped"), 10)  # the panel learns the rank is paused
    tid = _debug_events(kernel, "stopped")[0]["body"]["threadId"]
    frames = _debug_request(kernel, "stackTrace", threadId=tid)["body"]["stackFrames"]
    assert frames[0]["name"] == "halt" and frames[0]["line"] == 13
    assert _debug_request(kernel, "evaluate", expression="y * 2", frameId=frames[0]["id"],
                          context="repl")["body"]["result"] == "12"
    # A breakpoint from the panel in a cell: dumped here, written in the proc too.
    path = _debug_request(kernel, "dumpCell", code=STEPPER)["body"]["sourcePath"]
    bps = _debug_request(kernel, "setBreakpoints", source={"path": path}, breakpoints=[{"line": 6}])
    assert bps["success"] and bps["body"]["breakpoints"][0]["verified"]
    assert _debug_request(kernel, "continue", threadId=tid)["success"]
    kernel.run("fut = steppers.slice(gpus=1).work.call_one(7)\n"
               "monarch_nb.connect().debugger.wait_paused(1, 'steppers', timeout=60)")
    assert kernel.wait_for(lambda: len(_debug_events(kernel, "stopped")) == 2, 10)
    _debug_request(kernel, "continue", threadId=tid)
    assert kernel.run("print(fut.get(timeout=30))").strip() == "72"
    assert _debug_request(kernel, "disconnect")["success"]  # the panel's debugger off: breakpoints go
    assert kernel.run("print(steppers.slice(gpus=1).work.call_one(1).get(timeout=30))").strip() == "12"


def test_paused_ranks_survive_a_kernel_restart(kernel):
    kernel.run("steppers.halt.broadcast(5)\nimport monarch_nb\n"
               "monarch_nb.connect().debugger.wait_paused(4, 'steppers', timeout=60)")
    kernel.restart()
    out = kernel.run(f"%load_ext monarch_nb\n%monarch connect {NAME}\n%monarch debug")
    assert "4 paused" in out and out.count("halt") >= 4
    assert "it is `cluster`" in out and kernel.run("print(cluster.name)").strip() == NAME
    assert kernel.run("%monarch debug eval steppers y").split("\n")[:4] == [
        "[steppers 0] 5", "[steppers 1] 6", "[steppers 2] 7", "[steppers 3] 8"]
    shown = kernel.execute("%monarch debug")  # the live list: a widget, with html and plain fallbacks
    kernel.finish(shown)
    bundle = next(m["content"]["data"] for m in kernel.outputs[shown] if m["msg_type"] == "display_data")
    assert "application/vnd.jupyter.widget-view+json" in bundle and "<table>" in bundle["text/html"]
    assert "4 paused" in bundle["text/plain"]
    assert "continued 4 paused thread(s)" in kernel.run("%monarch debug continue --all")

    def widget_emptied():
        return any(m["msg_type"] == "comm_msg" and "no paused ranks" in str(m["content"]["data"].get("state", {}))
                   for msgs in kernel.outputs.values() for m in msgs)

    assert kernel.wait_for(widget_emptied, 10)  # updated by the hub's event, no new cell needed
    assert "no paused ranks" in kernel.run("%monarch debug")




# After test_paused_ranks_survive_a_kernel_restart: this one restarts the kernel too.
def test_a_breakpoint_by_name_after_a_kernel_restart_binds_to_the_code_the_actors_run(kernel):
    kernel.run(WORKER)
    kernel.run("%monarch procs wprocs --per-host gpus=4\n%monarch spawn w Worker --procs wprocs")
    old_file = kernel.run("print(Worker.compute.__code__.co_filename)").strip()
    kernel.restart()
    kernel.run(f"%load_ext monarch_nb\n%monarch connect {NAME}")
    kernel.run(WORKER)  # the same cell again: a new kernel's file name for it
    assert kernel.run("print(Worker.compute.__code__.co_filename)").strip() != old_file
    out = kernel.run("%monarch break Worker.compute w --ranks 2")
    assert f"bound in 1 proc(s) at {old_file}, the code the actors run" in out
    kernel.run("import monarch_nb\nc = monarch_nb.connect()\nw = c.actor_meshes['w']\nfut = w.compute.call(5)\n"
               "c.debugger.wait_paused(1, 'w', timeout=60)")
    rows = [line.split() for line in kernel.run("%monarch debug").splitlines() if line.startswith("w ")]
    assert [row[1] for row in rows] == ["2"]
    assert "continued w rank(s) 2" in kernel.run("%monarch debug continue w")
    assert kernel.run("print(list(fut.get(timeout=30).values()))").strip() == "[5, 6, 7, 8]"
    kernel.run("%monarch break --clear")
    # The class changed since the actors were spawned: nothing they run matches; say so at once.
    kernel.run(WORKER.replace("return y", "return y * 2"))
    out = kernel.run("%monarch break Worker.compute w --ranks 2")
    assert "binds nowhere yet: no actor of w runs this code" in out
    kernel.run("%monarch break --clear")


# After the restart tests: this one restarts the kernel too.
def test_a_breakpoint_by_name_binds_after_a_restart_with_the_class_in_a_cell_of_its_own(kernel):
    kernel.run(WORKER)  # imports and class in one cell, as when the actors are spawned
    kernel.run("%monarch procs moved_procs --per-host gpus=2\n%monarch spawn moved Worker --procs moved_procs")
    kernel.restart()
    kernel.run(f"%load_ext monarch_nb\n%monarch connect {NAME}")
    with pytest.raises(CellError) as e:  # not defined yet in this kernel: say what to do
        kernel.run("%monarch break Worker.compute moved")
    assert e.value.ename == "UsageError" and "re-run the cell that defines Worker" in e.value.evalue
    imports, _, cls = WORKER.partition("\n\n")
    kernel.run(imports)
    kernel.run(cls)  # the class in a cell of its own: another file, other line numbers
    out = kernel.run("%monarch break Worker.compute moved --ranks 1")
    assert "bound in 1 proc(s)" in out, out
    kernel.run("import monarch_nb\nc = monarch_nb.connect()\nmoved = c.actor_meshes['moved']\n"
               "fut = moved.compute.call(5)\nc.debugger.wait_paused(1, 'moved', timeout=60)")
    rows = [line for line in kernel.run("%monarch debug").splitlines() if line.startswith("moved ")]
    assert [row.split()[1] for row in rows] == ["1"] and "Cell of an earlier kernel, line 6" in rows[0], rows
    assert "y = x + context().actor_instance.rank.rank" in kernel.run("%monarch debug where moved 1")
    assert "continued moved rank(s) 1" in kernel.run("%monarch debug continue moved")
    assert kernel.run("print(list(fut.get(timeout=30).values()))").strip() == "[5, 6]"
    kernel.run("%monarch break --clear\nmoved_procs = c.proc_meshes['moved_procs']\nmoved_procs.stop()")
