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

import pytest

from conftest import cluster_processes, wait_until
from kernels import Kernel

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


def test_a_snapshot_is_sent_once_and_widgets_stay_live_until_the_kernel_goes():
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
