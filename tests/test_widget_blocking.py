"""The health tree while a cell blocks on a call: a frontend that connects (or reloads
the page) meanwhile gets the widgets' state, and the tree's levels open and close, from
the ``monarch`` kernel's widget subshell; the user's own widgets still wait for the cell
and run their callbacks in the main thread. Real kernels through jupyter_client, and
JupyterLab in headless Chromium."""

from __future__ import annotations

import json
import queue
import time
import urllib.request
import uuid

import pytest
from jupyter_client import BlockingKernelClient
from selenium.webdriver.common.by import By

from conftest import cluster_processes, wait_until
from kernels import Kernel
from test_health_browser import KERNEL_IDLE_JS, NODE, STATE_JS, browser, lab  # noqa: F401 (fixtures)

# An endpoint that blocks until the test creates a file: the cell holds the main shell
# exactly as long as the test wants, however slow the machine.
SETUP = """\
import os, threading, time
from monarch_nb.actor import Actor, endpoint, this_host
from monarch_nb.client.cluster import default_cluster

class Gate(Actor):
    @endpoint
    def wait_for(self, started: str, release: str, timeout: float) -> str:
        open(started, "w").close()
        deadline = time.monotonic() + timeout
        while not os.path.exists(release):
            if time.monotonic() > deadline:
                return "timed out"
            time.sleep(0.02)
        return "released"

procs = this_host().spawn_procs(per_host={"gpus": 2}, name="blk")
gate = procs.spawn("gate", Gate)
c = default_cluster()
"""

BLOCKING_CELL = "blocked = gate.slice(gpus=0).wait_for.call_one({started!r}, {release!r}, 120).get()\nblocked"


class SecondFrontend:
    """Another client of the same kernel, as a reloaded page is: sends shell messages
    with no ``subshell_id`` (as JupyterLab's widget manager does) and keeps its IOPub
    messages."""

    def __init__(self, kernel: Kernel):
        # Its own session (a frontend's own identity on the kernel's shell socket), as
        # jupyter_server's is; km.client() would share the first client's and take its replies.
        self.kc = BlockingKernelClient(connection_file=kernel.km.connection_file)
        self.kc.load_connection_file()
        self.kc.start_channels()
        self.iopub: list[dict] = []

    def pump(self, timeout: float = 0.2) -> None:
        try:
            self.iopub.append(self.kc.get_iopub_msg(timeout=timeout))
        except queue.Empty:
            pass

    def wait_iopub(self, match, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for msg in self.iopub[seen:]:
                if match(msg):
                    return msg
            seen = len(self.iopub)
            self.pump()
        return None

    def shell_reply(self, msg_id: str, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                reply = self.kc.get_shell_msg(timeout=0.2)
            except queue.Empty:
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply
        return None

    def send(self, msg_type: str, content: dict, metadata: dict | None = None) -> str:
        msg = self.kc.session.msg(msg_type, content, metadata=metadata)
        self.kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def comm_info(self, timeout: float) -> dict | None:
        """The kernel's comms, once its reply and its idle status (what JupyterLab waits
        for) arrive; ``None`` if they don't within ``timeout`` seconds. Once the status
        arrives, this client's IOPub subscription is live."""
        msg_id = self.send("comm_info_request", {"target_name": "jupyter.widget"})
        reply = self.shell_reply(msg_id, timeout)
        idle = self.wait_iopub(lambda m: m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status"
                               and m["content"]["execution_state"] == "idle", timeout)
        return reply["content"]["comms"] if reply is not None and idle is not None else None

    def comm_updates(self, comm_id: str) -> list[dict]:
        return [m["content"]["data"] for m in self.iopub
                if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id]

    def close(self) -> None:
        self.kc.stop_channels()


@pytest.fixture(scope="module")
def shown():
    """A monarch kernel whose cluster's health tree is on display; yields (kernel, the
    tree's model id). The cluster and the kernel end afterwards."""
    kernel = Kernel("monarch")
    try:
        kernel.run(SETUP)
        path = kernel.run("print(c.path)").strip()
        msg_id = kernel.execute("c")
        assert kernel.finish(msg_id)["status"] == "ok"
        # A cluster shows as display_data with a display id (turned into a snapshot when the kernel goes).
        [result] = [m["content"]["data"] for m in kernel.outputs[msg_id] if m["msg_type"] == "display_data"]
        yield kernel, result["application/vnd.jupyter.widget-view+json"]["model_id"]
        kernel.run("c.stop()")
    finally:
        kernel.shutdown()
    assert wait_until(lambda: not cluster_processes(path), 10)


def _block(kernel: Kernel, tmp_path) -> tuple[str, object]:
    """Run a cell that blocks on an actor call; returns (its msg_id, the file that
    releases it) once the call runs in the actor."""
    started, release = tmp_path / "started", tmp_path / "release"
    msg_id = kernel.execute(BLOCKING_CELL.format(started=str(started), release=str(release)))
    assert wait_until(started.exists, 60, 0.05), "the blocking call never started"
    return msg_id, release


def _finish(kernel: Kernel, msg_id: str, release) -> None:
    release.touch()
    assert kernel.finish(msg_id)["status"] == "ok"
    assert "'released'" in kernel.text(msg_id)


def _cell_running(kernel: Kernel, msg_id: str) -> bool:
    return not any(m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"
                   for m in kernel.outputs[msg_id])


def test_a_frontend_that_connects_while_a_cell_blocks_gets_the_health_tree(shown, tmp_path):
    kernel, tree_id = shown
    msg_id, release = _block(kernel, tmp_path)
    frontend = SecondFrontend(kernel)
    try:
        comms = wait_until(lambda: frontend.comm_info(2), 20, 0)  # retried until IOPub is live
        assert comms and tree_id in comms, "comm_info_request got no answer while the cell ran"
        control = uuid.uuid4().hex
        frontend.send("comm_open", {"comm_id": control, "target_name": "jupyter.widget.control", "data": {}},
                      metadata={"version": "1.0.0"})
        frontend.send("comm_msg", {"comm_id": control, "data": {"method": "request_states"}})
        reply = frontend.wait_iopub(lambda m: m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == control,
                                    10)
        assert reply is not None, "request_states got no answer while the cell ran"
        assert reply["content"]["data"]["method"] == "update_states"
        states = reply["content"]["data"]["states"]
        assert states[tree_id]["model_name"] == "VBoxModel"
        labels = [s["state"].get("value", "") for s in states.values() if s["model_name"] == "HTMLModel"]
        assert any('data-mnb-node="proc:blk/1" data-mnb-state="healthy"' in v for v in labels)
        assert any('data-mnb-node="actor:gate/0"' in v for v in labels)
        frontend.send("comm_close", {"comm_id": control, "data": {}})
        assert _cell_running(kernel, msg_id)
        # The page keeps showing the kernel busy: no idle status but for the comm_info_request.
        idle_for = {m["parent_header"].get("msg_type") for m in frontend.iopub
                    if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"}
        assert idle_for <= {"comm_info_request"}, idle_for
    finally:
        frontend.close()
        _finish(kernel, msg_id, release)


def test_the_trees_levels_open_and_close_while_a_cell_blocks(shown, tmp_path):
    kernel, _ = shown
    toggle = kernel.run("from monarch_nb.notebook.health_widget import widget_for\n"
                        "print(widget_for(c).find('mesh:gate').toggle.model_id)").strip()
    msg_id, release = _block(kernel, tmp_path)
    frontend = SecondFrontend(kernel)
    try:
        assert wait_until(lambda: frontend.comm_info(2), 20, 0)
        frontend.send("comm_msg", {"comm_id": toggle, "data": {"method": "custom", "content": {"event": "click"}}})
        opened = frontend.wait_iopub(lambda m: m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == toggle
                                     and m["content"]["data"].get("state", {}).get("description") == "▾", 10)
        assert opened is not None, "a click on the tree was not handled while the cell ran"
        assert _cell_running(kernel, msg_id)
    finally:
        frontend.close()
        _finish(kernel, msg_id, release)
    assert kernel.run("print(widget_for(c).find('mesh:gate/1') is not None)").strip() == "True"


def test_the_users_own_widgets_still_wait_for_the_cell_and_run_in_the_main_thread(shown, tmp_path):
    kernel, _ = shown
    release = tmp_path / "release"
    button = kernel.run("import ipywidgets, threading\n"
                        "clicks = []\n"
                        "button = ipywidgets.Button()\n"
                        "button.on_click(lambda _: clicks.append((threading.current_thread().name,\n"
                        f"                                         os.path.exists({str(release)!r}))))\n"
                        "print(button.model_id)").strip()
    msg_id, release = _block(kernel, tmp_path)
    frontend = SecondFrontend(kernel)
    try:
        assert wait_until(lambda: frontend.comm_info(2), 20, 0)
        frontend.send("comm_msg", {"comm_id": button, "data": {"method": "custom", "content": {"event": "click"}}})
        # The kernel answers a request sent after the click: the click has been routed.
        assert wait_until(lambda: frontend.comm_info(2), 20, 0)
    finally:
        frontend.close()
        _finish(kernel, msg_id, release)
    # Handled after the cell (the release file exists then), in the main thread.
    assert kernel.run("print(clicks)").strip() == "[('MainThread', True)]"


def test_widget_states_are_answered_while_another_thread_makes_widgets(shown, tmp_path):
    kernel, tree_id = shown
    # A user's thread that keeps making and closing widgets (as a progress bar or a
    # callback may, while the cell blocks): the registries the answers read keep changing.
    kernel.run("import ipywidgets, threading\n"
               "churning = threading.Event()\n"
               "def churn():\n"
               "    while not churning.is_set():\n"
               "        ipywidgets.HTML('x').close()\n"
               "        churning.wait(0.02)\n"
               "threading.Thread(target=churn, daemon=True).start()")
    msg_id, release = _block(kernel, tmp_path)
    frontend = SecondFrontend(kernel)
    try:
        assert wait_until(lambda: frontend.comm_info(2), 20, 0)
        for _ in range(30):
            assert tree_id in (frontend.comm_info(10) or {}), "a comm_info_request went unanswered"
            control = uuid.uuid4().hex
            frontend.send("comm_open", {"comm_id": control, "target_name": "jupyter.widget.control", "data": {}},
                          metadata={"version": "1.0.0"})
            frontend.send("comm_msg", {"comm_id": control, "data": {"method": "request_states"}})
            reply = frontend.wait_iopub(lambda m: m["msg_type"] == "comm_msg"
                                        and m["content"]["comm_id"] == control, 10)
            assert reply is not None and tree_id in reply["content"]["data"]["states"], (
                "a request_states went unanswered")
            frontend.send("comm_close", {"comm_id": control, "data": {}})
            kernel.drain()  # the churn's messages, which would fill the first client's IOPub queue
    finally:
        frontend.close()
        _finish(kernel, msg_id, release)
        kernel.run("churning.set()")


def _put_notebook(url: str, token: str, name: str, cells: list[str]) -> None:
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"name": "monarch", "display_name": "Monarch (Python 3)", "language": "python"}},
        "cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": s}
                  for s in cells]}
    body = json.dumps({"type": "notebook", "format": "json", "content": notebook}).encode()
    request = urllib.request.Request(f"{url}/api/contents/{name}", data=body, method="PUT",
                                     headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10):
        pass


KERNEL_READY_JS = """
const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
return !!(k && k.status === 'idle' && w.context.path === arguments[0]);"""
AFTER_THE_CELL_JS = """
const done = arguments[arguments.length - 1];
const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
const future = kernel.requestExecute({code: arguments[0]});
let out = "";
future.onIOPub = m => { if (m.header.msg_type === 'stream') out += m.content.text; };
future.done.then(() => done(out), e => done('failed: ' + e));"""
OUTPUTS_JS = "return Array.from(document.querySelectorAll('.jp-OutputArea-output')).map(n => n.textContent);"


def test_a_reloaded_page_shows_the_tree_while_a_cell_blocks(lab, browser, tmp_path):
    url, token, server, api = lab
    started, release = tmp_path / "started", tmp_path / "release"
    _put_notebook(url, token, "blocking.ipynb",
                  [SETUP, "c", BLOCKING_CELL.format(started=str(started), release=str(release))])
    browser.get(f"{url}/lab/tree/blocking.ipynb?token={token}")
    assert wait_until(lambda: browser.execute_script(KERNEL_READY_JS, "blocking.ipynb"), 90, 0.25), (
        "notebook or kernel never ready")
    browser.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")
    proc = NODE.format("proc:blk/1")
    assert wait_until(lambda: browser.execute_script(STATE_JS, proc) == "healthy", 90, 0.25)
    assert wait_until(started.exists, 60, 0.1), "the blocking cell never started its call"
    # Saved with the tree's output (a reloaded page reads the notebook from disk).
    browser.execute_script("return window.jupyterapp.commands.execute('docmanager:save');")
    assert wait_until(lambda: not browser.execute_script(
        "return window.jupyterapp.shell.currentWidget.context.model.dirty;"), 30, 0.1)

    try:
        browser.refresh()
        shown = wait_until(lambda: browser.execute_script(STATE_JS, proc) == "healthy", 30, 0.25)
        outputs = browser.execute_script(OUTPUTS_JS)
        assert shown, f"the tree did not render while the cell ran; outputs: {outputs}"
        assert not any("Loading widget" in text for text in outputs)
        assert not release.exists()  # the cell still blocks
        # Its levels open and close meanwhile.
        mesh_toggle = browser.find_element(By.XPATH, '//*[@data-mnb-node="mesh:gate"]'
                                                     '/ancestor::div[contains(@class, "widget-hbox")][1]//button')
        mesh_toggle.click()
        assert wait_until(lambda: browser.execute_script(STATE_JS, NODE.format("mesh:gate/1")) is not None, 30, 0.1)
    finally:
        release.touch()
    # The cell ends normally; its result shows in the page that ran it (a page shows the
    # output of its own requests only), so this page asks for it.
    browser.set_script_timeout(90)
    assert browser.execute_async_script(AFTER_THE_CELL_JS, "print(blocked)") == "released\n"
