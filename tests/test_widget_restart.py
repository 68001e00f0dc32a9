"""The health tree when its kernel goes: a displayed cluster is a live widget while the
kernel lives; once the kernel restarts or shuts down, the earlier output is a readable
static snapshot of the tree, not a dead widget with a broken link on every node.

Two paths, both checked: the kernel replaces each live display with its snapshot
(``update_display_data`` for its ``display_id``, on IOPub before it goes), which a
frontend that still listens applies (``jupyter_client``, a restart through the server's
REST API); and a page whose JupyterLab restarted the kernel itself (and so ignores what
the dying kernel sends) shows the disconnected widget as a snapshot through the widget's
own stylesheet. The browser part runs JupyterLab with headless Chromium (see
``test_health_browser``)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from selenium.webdriver.common.by import By

from conftest import cluster_processes, pids_alive, wait_until
from kernels import Kernel
# The notebook of test_health_browser (spawns procs "browser", shows `cluster`) and its
# JupyterLab + Chromium fixtures (skipped, saying why, without chromium).
from test_health_browser import KERNEL_IDLE_JS, NODE, STATE_JS, browser, lab  # noqa: F401

ARTIFACTS = Path(__file__).resolve().parents[1] / ".ci" / "artifacts"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

SHOW_CLUSTER = """\
from monarch_nb.actor import this_host
from monarch_nb.client.cluster import default_cluster
this_host().spawn_procs(per_host={'gpus': 2}, name='snap')
c = default_cluster()
print(c.path)"""


def _messages(kernel: Kernel, msg_id: str, msg_type: str) -> list[dict]:
    return [m["content"] for m in kernel.outputs[msg_id] if m["msg_type"] == msg_type]


@pytest.mark.parametrize("kernel_name", ["monarch", "python3"])
def test_a_kernel_restart_replaces_the_live_widget_by_a_static_snapshot_of_the_tree(kernel_name):
    """``monarch``: ``MonarchKernel.do_shutdown`` sends them; ``python3``: a stock kernel,
    where the notebook layer sees its shell's ``exit_now`` turn true (which the stock
    ``do_shutdown`` does)."""
    kernel = Kernel(kernel_name)
    path = None
    try:
        path = kernel.run(SHOW_CLUSTER).strip().splitlines()[-1]
        shown = kernel.execute("c")
        assert kernel.finish(shown)["status"] == "ok"
        [display] = _messages(kernel, shown, "display_data")
        display_id = display["transient"]["display_id"]
        assert "model_id" in display["data"][WIDGET_VIEW]  # live while the kernel lives

        kernel.km.restart_kernel(now=False)  # shutdown_request(restart=True) on control, then a new kernel

        def snapshot():
            return [u for u in _messages(kernel, shown, "update_display_data")
                    if u["transient"].get("display_id") == display_id]

        assert kernel.wait_for(snapshot, 30), f"no update_display_data for the display: {kernel.outputs[shown]}"
        [update] = snapshot()
        data = update["data"]
        assert WIDGET_VIEW not in data
        assert 'data-mnb-node="proc:snap/1" data-mnb-state="healthy"' in data["text/html"]
        assert "kernel restarted" in data["text/html"] and "snapshot at " in data["text/html"]
        assert "snap/1  healthy" in data["text/plain"] and "kernel restarted" in data["text/plain"]
        kernel.kc.wait_for_ready(timeout=60)  # the new kernel answers
        assert kernel.run("print(1 + 1)").strip() == "2"
    finally:
        kernel.shutdown()
    # The old kernel's ephemeral cluster ended with it (the snapshot kept nothing alive).
    assert path and wait_until(lambda: not cluster_processes(path), 30), cluster_processes(path)


def test_every_display_of_a_cluster_stays_live_then_turns_into_a_snapshot_at_shutdown():
    kernel = Kernel("monarch")
    path = None
    try:
        path = kernel.run(SHOW_CLUSTER).strip().splitlines()[-1]
        first = kernel.execute("c")
        assert kernel.finish(first)["status"] == "ok"
        second = kernel.execute("%load_ext monarch_nb\n%monarch status")
        assert kernel.finish(second)["status"] == "ok"
        ids = [d["transient"]["display_id"] for msg_id in (first, second)
               for d in _messages(kernel, msg_id, "display_data") if WIDGET_VIEW in d["data"]]
        assert len(ids) == 2 and len(set(ids)) == 2
        live = kernel.run("from monarch_nb.notebook import live_displays\nprint(live_displays.live())")
        assert all(i in live for i in ids)
        assert not any(_messages(kernel, m, "update_display_data") for m in (first, second))  # nothing yet
        kernel.kc.shutdown(restart=False)  # what "Shut Down Kernel" asks

        def updates():
            return [u["transient"]["display_id"] for m in (first, second)
                    for u in _messages(kernel, m, "update_display_data")]

        assert kernel.wait_for(lambda: len(updates()) == 2, 30), kernel.outputs
        assert sorted(updates()) == sorted(ids)
        assert all("kernel shut down" in u["data"]["text/plain"] for m in (first, second)
                   for u in _messages(kernel, m, "update_display_data"))
    finally:
        kernel.shutdown()
    assert path and wait_until(lambda: not cluster_processes(path), 30), cluster_processes(path)


# -- in JupyterLab ----------------------------------------------------------------------
# What the output of the `cluster` cell (the notebook's second) shows: its widget nodes,
# static-HTML nodes, broken-link icons in view, the snapshot line, any error text.
OUTPUT_JS = """
const cell = document.querySelectorAll('.jp-Notebook .jp-Cell')[1];
const out = cell && cell.querySelector('.jp-OutputArea');
if (!out) return null;
const visible = e => e && getComputedStyle(e).display !== 'none' && e.getClientRects().length > 0;
const disconnected = [...out.querySelectorAll('.jupyter-widgets-disconnected')];
const gone = out.querySelector('.mnb-gone');
return {
  text: out.innerText,
  widget_nodes: [...out.querySelectorAll('.jupyter-widgets [data-mnb-node]')].map(e => e.dataset.mnbNode),
  html_nodes: [...out.querySelectorAll('.jp-RenderedHTMLCommon [data-mnb-node]')].map(e => e.dataset.mnbNode),
  disconnected: disconnected.length,
  icons: disconnected.filter(e => getComputedStyle(e, '::before').display !== 'none').length,
  gone_note: visible(gone) ? gone.innerText : null,
};"""
KERNEL_ID_JS = "return window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.id;"


def _run_all_and_wait_healthy(browser) -> None:
    browser.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")
    assert wait_until(lambda: browser.execute_script(STATE_JS, NODE.format("proc:browser/1")) == "healthy", 90, 0.25), (
        "the widget never showed proc browser/1 healthy")


def test_jupyterlab_shows_the_tree_of_a_restarted_kernel_as_a_snapshot_not_broken_widgets(lab, browser):
    url, token, server, api = lab
    browser.get(f"{url}/lab/tree/health.ipynb?token={token}")
    assert wait_until(lambda: browser.execute_script(KERNEL_IDLE_JS), 90, 0.25), "notebook or kernel never ready"
    _run_all_and_wait_healthy(browser)
    live = browser.execute_script(OUTPUT_JS)
    assert "proc:browser/1" in live["widget_nodes"] and live["disconnected"] == 0 and live["gone_note"] is None
    behind = [p.pid for p in psutil.Process(server.pid).children(recursive=True)]

    # 1. JupyterLab's own restart (the Restart Kernel command, past its dialog). Lab forgets
    # the old kernel's requests first, so the kernel's snapshot can't reach the page: the
    # disconnected widget itself reads as a snapshot.
    browser.execute_script("window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart();")
    assert wait_until(lambda: browser.execute_script(OUTPUT_JS)["disconnected"] > 0, 30, 0.1), (
        "the widgets never turned disconnected")
    assert wait_until(lambda: browser.execute_script(KERNEL_IDLE_JS), 90, 0.25), "the restarted kernel never ready"
    after = browser.execute_script(OUTPUT_JS)
    assert {"proc:browser/0", "proc:browser/1", "mesh:workers"} <= set(after["widget_nodes"]), after
    assert "browser/1" in after["text"] and "workers" in after["text"]  # readable, not just in the DOM
    assert after["icons"] == 0, f"{after['icons']} broken-link icons shown"
    assert after["gone_note"] and "no longer updates" in after["gone_note"]
    assert "model not found" not in after["text"] and "Error displaying widget" not in after["text"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "health_widget_after_lab_restart.png"))

    # 2. A restart through the server's REST API (another client, a script): the page
    # still listens to the old kernel, and the output becomes the static snapshot.
    _run_all_and_wait_healthy(browser)  # a new cluster in the new kernel, shown again
    behind += [p.pid for p in psutil.Process(server.pid).children(recursive=True)]
    kernel_id = browser.execute_script(KERNEL_ID_JS)
    api(f"/api/kernels/{kernel_id}/restart", "POST")

    def static():
        shown = browser.execute_script(OUTPUT_JS)
        return shown if "proc:browser/1" in shown["html_nodes"] and not shown["widget_nodes"] else None

    snapshot = wait_until(static, 30, 0.1)
    assert snapshot, f"the output never turned into the static tree: {browser.execute_script(OUTPUT_JS)}"
    assert "kernel restarted" in snapshot["text"] and "snapshot at " in snapshot["text"]
    assert "model not found" not in snapshot["text"] and snapshot["icons"] == 0
    assert wait_until(lambda: browser.execute_script(KERNEL_IDLE_JS), 90, 0.25), "the restarted kernel never ready"
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});",
                           browser.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-Cell")[1])
    assert browser.save_screenshot(str(ARTIFACTS / "health_snapshot_after_rest_restart.png"))

    for kernel in api("/api/kernels"):
        api(f"/api/kernels/{kernel['id']}", "DELETE")
    assert wait_until(lambda: not pids_alive(behind), 60), f"left behind: {pids_alive(behind)}"
