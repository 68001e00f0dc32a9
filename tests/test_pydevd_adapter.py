"""Every debugpy/pydevd internal that ``monarch_nb.debug.pydevd_adapter`` reaches into,
checked against the installed debugpy on the running Python (CI: 3.11 and 3.13), so a
debugpy or CPython that moved one fails here rather than slowing procs in silence.

debugpy listens once per process and traces it, so the checks that need a live
debugger run in one child process (armed as a proc arms: in-process adapter, our DAP
client attached) that reports what it found as JSON; each test reads one finding.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import pytest

from monarch_nb.debug import pydevd_adapter

pytest.importorskip("debugpy")

ARMED_PROBE = textwrap.dedent("""
    import inspect, json, os, socket, sys, threading
    from monarch_nb.debug import pydevd_adapter
    from monarch_nb.debug.dap import DapClient

    out = {}
    client = DapClient(pydevd_adapter.connect_private())
    sock = pydevd_adapter.dap_socket()
    out["dap_socket_family"] = None if sock is None else sock.family.name

    def listening_ports():
        # TCP/TCP6 ports on which a socket of this process listens (state 0A)
        inodes = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # the listing's own fd, closed by now
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        ports = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for row in open(table).read().splitlines()[1:]:
                fields = row.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
        return ports
    client.request("initialize", clientID="test", adapterID="debugpy", pathFormat="path",
                   linesStartAt1=True, columnsStartAt1=True)
    client.request("attach", justMyCode=True, redirectOutput=False, subProcess=False)
    client.request("configurationDone")
    out["listening_ports"] = listening_ports()
    out["answers_dap"] = "supportsConfigurationDoneRequest" in client.request(
        "initialize", clientID="again", adapterID="debugpy", pathFormat="path")
    out["global_debugger"] = pydevd_adapter.global_debugger() is not None
    out["constants"] = {name: pydevd_adapter._reach(pydevd_adapter.CONSTANTS, name, "missing") is not None
                        for name in ("get_global_debugger", "get_thread_id", "PYDEVD_USE_SYS_MONITORING")}
    out["uses_sys_monitoring"] = pydevd_adapter.uses_sys_monitoring()
    out["stop_monitoring"] = (sys.version_info < (3, 12)
                              or callable(pydevd_adapter._sys_monitoring("stop_monitoring", "missing")))
    out["wake"] = pydevd_adapter.wake(threading.get_ident())

    def traced():
        monitoring = getattr(sys, "monitoring", None)
        return sys.gettrace() is not None or (
            monitoring is not None and monitoring.get_tool(monitoring.DEBUGGER_ID) is not None)

    out["untrace_all"] = pydevd_adapter.untrace_all()
    out["traced_after_untrace"] = traced()
    out["monitoring_tool_after_untrace"] = pydevd_adapter.monitoring_tool()
    out["retrace_all"] = pydevd_adapter.retrace_all()
    import pydevd
    out["settrace_stop_at_frame"] = "stop_at_frame" in inspect.signature(pydevd.settrace).parameters
    print(json.dumps(out), flush=True)
    import os
    os._exit(0)  # debugpy's threads would keep the process alive
""")


@pytest.fixture(scope="module")
def armed():
    """What the adapter found in a child process with debugpy armed."""
    done = subprocess.run([sys.executable, "-c", ARMED_PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "monarch_nb:" not in done.stderr, done.stderr  # the adapter reported a missing internal
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_installed_debugpy_is_a_version_the_adapter_was_written_for():
    assert pydevd_adapter.debugpy_version() is not None
    assert pydevd_adapter.supported()


def test_pydevd_constants_give_the_global_debugger_and_thread_ids(armed):
    assert armed["constants"] == {"get_global_debugger": True, "get_thread_id": True,
                                  "PYDEVD_USE_SYS_MONITORING": True}


def test_pydevd_traces_with_sys_monitoring_exactly_from_python_3_12(armed):
    assert armed["uses_sys_monitoring"] == (sys.version_info >= (3, 12))


def test_the_sys_monitoring_tracer_has_stop_monitoring_from_python_3_12(armed):
    assert armed["stop_monitoring"]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12+ untraces through sys.monitoring")
def test_cpython_3_11_has_the_c_api_to_untrace_every_thread_state():
    import ctypes

    assert hasattr(ctypes.pythonapi, "_PyEval_SetTrace")


def test_debugpy_has_the_post_mortem_entry_point():
    import debugpy

    assert callable(getattr(debugpy, "trigger_exception_handler", None))


def test_hidden_threads_carry_the_attributes_pydevd_reads():
    thread = threading.Thread(target=lambda: None)
    pydevd_adapter.hide_thread(thread)
    assert thread.pydev_do_not_trace and thread.is_pydev_daemon_thread


def test_pydevd_runs_on_a_socketpair_and_nothing_listens(armed):
    # debugpy.listen kept a loopback TCP port for the proc's life: any local user could
    # connect (DAP has no authentication) and run code as the proc's owner.
    assert armed["dap_socket_family"] == "AF_UNIX"
    assert armed["listening_ports"] == []
    assert armed["answers_dap"]  # and our session speaks DAP with it over the pair


def test_the_global_debugger_is_there_once_armed(armed):
    assert armed["global_debugger"]


def test_a_resumed_thread_can_be_woken(armed):
    assert armed["wake"]


def test_an_armed_process_can_be_untraced_entirely(armed):
    assert armed["untrace_all"]
    assert not armed["traced_after_untrace"]
    assert armed["monitoring_tool_after_untrace"] is None


def test_an_untraced_process_can_be_traced_again(armed):
    assert armed["retrace_all"]


def test_pydevd_can_stop_in_a_given_frame(armed):
    assert armed["settrace_stop_at_frame"]
