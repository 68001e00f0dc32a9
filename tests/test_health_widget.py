"""The health tree on display: the live ipywidgets tree (its model state as the cluster
changes), the text/html and text/plain versions, a displayed Cluster in a real kernel,
and `monarch-nb cluster status [--watch]` in a terminal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from monarch_nb import health_view
from monarch_nb.actor import Actor, endpoint
from monarch_nb.client.cluster import Cluster
from monarch_nb.notebook.health_widget import HealthWidget
from monarch_nb.proc import activity

from conftest import cluster_processes, wait_until
from kernels import Kernel
from sample_actors import Counter


@pytest.fixture
def workers(host):
    procs = host.spawn_procs(per_host={"gpus": 3}, name="hw")
    counters = procs.spawn("hwc", Counter)
    yield procs, counters
    procs.stop()


@pytest.fixture
def widget(cluster):
    made = []

    def make(**kwargs) -> HealthWidget:
        made.append(HealthWidget(cluster, **kwargs))
        return made[-1]

    yield make
    for w in made:
        w.close()
        assert not w._watch.running, "the widget's feed outlived close()"


def test_widget_turns_a_killed_proc_failed_with_its_cause(cluster, workers, widget):
    procs, _ = workers
    w = widget()
    assert wait_until(lambda: w.state_of("proc:hw/1") == "healthy", 10)
    assert w.state_of("actor:hwc/1") == "healthy" and w.state_of("mesh:hwc") == "healthy"
    os.kill(procs.pids[1], signal.SIGKILL)
    assert wait_until(lambda: w.state_of("proc:hw/1") == "failed", 10)
    label = w.find("proc:hw/1").label.value
    assert "killed by SIGKILL" in label and f"pid {procs.pids[1]}" in label
    assert w.state_of("actor:hwc/1") == "failed" and w.state_of("proc:hw/0") == "healthy"
    assert wait_until(lambda: w.state_of("mesh:hwc") == "failed", 5)
    assert "1 failed" in w._summary.value and 'data-mnb-state="degraded"' in w._summary.value


def test_widget_follows_hub_events_without_polling(cluster, workers, widget):
    procs, _ = workers
    w = widget(tick_s=3600.0)  # no tick: only hub events can bring the change
    assert wait_until(lambda: w.state_of("proc:hw/2") == "healthy", 10)

    def quiet_for_a_second() -> bool:  # once the spawn's events are handled, nothing polls
        seen = w.refreshes
        return not wait_until(lambda: w.refreshes > seen, 1.0)

    assert wait_until(quiet_for_a_second, 10), "it keeps refreshing without events"
    os.kill(procs.pids[2], signal.SIGKILL)
    assert wait_until(lambda: w.state_of("proc:hw/2") == "failed", 10)


def test_widget_shows_a_busy_actor_with_its_endpoint(cluster, workers, widget):
    _, counters = workers
    w = widget()
    pending = counters.slice(gpus=0).slow_echo.call_one("done", 3.0)

    def busy_label():
        view = w.find("actor:hwc/0")
        return view is not None and "busy: slow_echo for" in view.label.value

    assert wait_until(busy_label, 10)
    assert w.state_of("proc:hw/0") == "busy" and "1 busy" in w._summary.value
    assert pending.get(timeout=30) == "done"
    assert wait_until(lambda: w.state_of("actor:hwc/0") == "healthy", 10)


class Pausing(Actor):
    @endpoint
    def pause_here(self, seconds: float) -> None:
        """Mark this actor's thread stopped in the debugger, as the debugger does, for a while."""
        activity.set_paused(threading.get_ident(), {"file": "train.py", "line": 42, "function": "step"})
        try:
            time.sleep(seconds)
        finally:
            activity.set_paused(threading.get_ident(), None)


def test_widget_shows_an_actor_paused_in_the_debugger_with_where(cluster, workers, widget):
    procs, _ = workers
    pausing = procs.spawn("pausing", Pausing)
    w = widget()
    pending = pausing.slice(gpus=2).pause_here.call_one(3.0)
    assert wait_until(lambda: w.state_of("proc:hw/2") == "paused", 10)
    assert "paused in the debugger at train.py:42 in step" in w.find("actor:pausing/2").label.value
    assert "paused in the debugger at train.py:42 in step" in w.find("proc:hw/2").label.value
    assert "1 paused" in w._summary.value
    pending.get(timeout=30)
    assert wait_until(lambda: w.state_of("proc:hw/2") == "healthy", 10)


def test_widget_keeps_what_the_user_opened_and_closed_across_redraws(cluster, workers, widget):
    w = widget()
    assert wait_until(lambda: w.find("proc:hw/0") is not None, 10)
    proc = w.find("proc:hw/0")
    mesh = w.find("mesh:hwc")
    assert proc.open and not mesh.open and w.find("mesh:hwc/0") is None  # the defaults
    proc._on_toggle()  # what a click on its toggle does
    mesh._on_toggle()
    assert w.find("actor:hwc/0") is None and w.find("mesh:hwc/0") is not None
    seen = w.refreshes
    assert wait_until(lambda: w.refreshes >= seen + 2, 10)
    assert w.find("proc:hw/0") is proc and not proc.open and proc.body.layout.display == "none"
    assert w.find("mesh:hwc") is mesh and mesh.open
    # A new mesh adds nodes; those there keep their widgets and state.
    extra = cluster.host_mesh().spawn_procs(per_host={"gpus": 1}, name="hw_extra")
    try:
        assert wait_until(lambda: w.find("proc:hw_extra/0") is not None, 10)
        assert w.find("proc:hw/0") is proc and not proc.open
    finally:
        extra.stop()
    assert wait_until(lambda: w.find("proc:hw_extra/0") is None, 10)  # gone with its mesh


def test_widget_stops_updating_when_its_cluster_stops():
    cluster = Cluster.start_ephemeral()
    try:
        cluster.host_mesh().spawn_procs(per_host={"gpus": 1}, name="brief")
        w = HealthWidget(cluster, tick_s=0.2)
        try:
            assert wait_until(lambda: w.state_of("proc:brief/0") == "healthy", 10)
        finally:
            cluster.stop()
        assert wait_until(lambda: w.ended == "cluster stopped", 10)
        assert not w._watch.running
        assert w.state_of("proc:brief/0") == "stopped" and 'data-mnb-state="stopped"' in w._summary.value
    finally:
        if not cluster._stopped:
            cluster.stop()
        if "w" in locals():
            w.close()
    assert wait_until(lambda: not cluster_processes(cluster.path), 10)


def test_html_and_plain_text_show_the_tree_and_a_failure_with_its_cause(cluster, workers):
    procs, _ = workers
    os.kill(procs.pids[0], signal.SIGKILL)
    tree = wait_until(lambda: (lambda t: t if t["counts"]["failed"] else None)(cluster.health()), 10)
    html = health_view.to_html(tree)
    assert 'data-mnb-node="proc:hw/0" data-mnb-state="failed"' in html
    assert 'data-mnb-node="proc:hw/1" data-mnb-state="healthy"' in html
    assert "<b>killed by SIGKILL</b>" in html and "<details" in html and tree["summary"].split(" · ")[0] in html
    plain = health_view.to_plain(tree)
    lines = plain.splitlines()
    assert lines[0] == f"cluster {tree['cluster']} · {tree['summary']}"
    assert any(line.strip().startswith("✗ hw/0  failed: killed by SIGKILL") for line in lines)
    assert any(line.strip().startswith("● hw/1  healthy") for line in lines)
    assert "gpus=3 · 2/3 healthy" in plain


def test_a_cluster_displayed_in_a_kernel_is_the_live_widget_with_html_and_plain_fallbacks():
    kernel = Kernel()
    try:
        path = kernel.run("from monarch_nb.actor import this_host\n"
                          "from monarch_nb.client.cluster import default_cluster\n"
                          "this_host().spawn_procs(per_host={'gpus': 2}, name='shown')\n"
                          "c = default_cluster()  # the ephemeral cluster this_host() started\n"
                          "print(c.path)").strip()
        msg_id = kernel.execute("c")
        assert kernel.finish(msg_id)["status"] == "ok"
        # display_data with a display_id (so it can be replaced by a snapshot when the kernel goes)
        [shown] = [m["content"] for m in kernel.outputs[msg_id] if m["msg_type"] == "display_data"]
        result = shown["data"]
        assert shown["transient"]["display_id"]
        assert "model_id" in result["application/vnd.jupyter.widget-view+json"]
        assert 'data-mnb-node="proc:shown/1" data-mnb-state="healthy"' in result["text/html"]
        assert "2/2 procs healthy" in result["text/plain"] and "shown/1  healthy" in result["text/plain"]
        # The widget's state reached the frontend over comms: its label carries the node.
        labels = [m["content"]["data"].get("state", {}).get("value", "") for m in kernel.outputs[msg_id]
                  if m["msg_type"] in ("comm_open", "comm_msg")]
        assert any('data-mnb-node="proc:shown/1" data-mnb-state="healthy"' in str(v) for v in labels)
        again = kernel.execute("%load_ext monarch_nb\n%monarch status")
        assert kernel.finish(again)["status"] == "ok"
        shown = [m["content"]["data"] for m in kernel.outputs[again] if m["msg_type"] == "display_data"]
        views = [d["application/vnd.jupyter.widget-view+json"]["model_id"] for d in shown
                 if "application/vnd.jupyter.widget-view+json" in d]
        assert views == [result["application/vnd.jupyter.widget-view+json"]["model_id"]]  # one widget per cluster
        kernel.run("c.stop()")
    finally:
        kernel.shutdown()
    assert wait_until(lambda: not cluster_processes(path), 10)


def _status(*args: str, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "monarch_nb.cli", "cluster", "status", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"}, **kwargs)


def test_cli_status_prints_the_health_tree(cluster, workers):
    procs, _ = workers
    out, _ = _status(cluster.name).communicate(timeout=60)
    assert f"cluster {cluster.name} · " in out and "procs healthy" in out
    assert f"● hw/2  healthy · pid {procs.pids[2]}" in out and "● hwc[2]  sample_actors.Counter · healthy" in out
    assert "hwc  sample_actors.Counter · on hw · gpus=3 · 3/3 healthy" in out


def test_cli_status_watch_shows_a_proc_turning_failed(cluster, workers):
    procs, _ = workers
    watch = _status(cluster.name, "--watch", "--interval", "0.2", "--count", "150")
    try:
        def read_until(text: str) -> bool:
            for line in watch.stdout:  # frames keep coming, so this ends within --interval
                if text in line:
                    return True
            return False

        assert read_until(f"● hw/1  healthy · pid {procs.pids[1]}")
        os.kill(procs.pids[1], signal.SIGKILL)
        assert read_until(f"✗ hw/1  failed: killed by SIGKILL · pid {procs.pids[1]}")
        watch.send_signal(signal.SIGINT)  # Ctrl-C ends a watch quietly
        assert watch.wait(timeout=30) == 0
    finally:
        watch.kill()
        watch.wait()


def test_cli_status_watch_ends_after_count(cluster):
    out, _ = (watch := _status(cluster.name, "--watch", "--interval", "0.05", "--count", "3")).communicate(timeout=60)
    assert watch.returncode == 0 and out.count(f"cluster {cluster.name} · ") == 3 and "refresh 3" in out


def _synthetic_tree(hosts: int, procs_per_host: int, meshes: tuple[str, ...] = ("w",)) -> dict:
    """A health tree as the hub answers it, without a cluster."""
    def proc(h: int, r: int) -> dict:
        return {"proc_id": f"p/{h * procs_per_host + r}", "pid": 100 + r, "state": "healthy",
                "actors": [{"mesh": m, "rank": h * procs_per_host + r, "class": "W", "state": "healthy"}
                           for m in meshes]}

    size = hosts * procs_per_host
    return {"cluster": "synthetic", "state": "healthy", "summary": f"{size}/{size} procs healthy",
            "hosts": [{"host_id": f"host{h}", "hostname": "vm", "pid": 10 + h, "state": "healthy",
                       "procs": [proc(h, r) for r in range(procs_per_host)]} for h in range(hosts)],
            "actor_meshes": [{"name": m, "class": "W", "proc_mesh": "p", "extent": {"procs": size}, "alive": size,
                              "size": size, "state": "healthy", "actors": []} for m in meshes]}


def test_a_large_tree_starts_as_one_closed_line_per_host():
    hosts = health_view.nodes(_synthetic_tree(16, 8))[0].children
    assert len(hosts) == 16 and not any(h.open for h in hosts)
    assert health_view.to_html(_synthetic_tree(16, 8)).count("<details open>") == 2  # the two sections only
    assert all(h.open for h in health_view.nodes(_synthetic_tree(2, 4))[0].children)  # a small one opens


def test_exec_meshes_of_the_magic_are_hidden_unless_asked_for():
    tree = _synthetic_tree(1, 2, meshes=("w", "p.exec"))
    plain = health_view.to_plain(tree)
    assert "w[0]" in plain and "p.exec" not in plain and "actor meshes (1)" in plain
    shown = health_view.nodes(tree, internal=True)
    assert [m.title for m in shown[1].children] == ["w", "p.exec"]


def test_state_marks_have_a_glyph_in_the_fonts_a_debian_desktop_has():
    if subprocess.run(["sh", "-c", "command -v fc-list"], capture_output=True).returncode != 0:
        pytest.skip("fontconfig's fc-list is not installed")
    missing = [f"{state} {mark!r}" for state, mark in health_view.STATE_MARKS.items()
               if not subprocess.run(["fc-list", f":charset={ord(mark):x}", "family"], capture_output=True,
                                     text=True).stdout.strip()]
    assert not missing, f"no installed font draws: {', '.join(missing)}"


def test_cli_status_prints_the_log_stores_size_and_limits(cluster):
    out, _ = _status(cluster.name).communicate(timeout=60)
    assert "log store: " in out and f"{cluster.path / 'logs' / 'lines.sqlite'}" in out, out
    assert "keeps 1,024 MiB and 7 days ([logs] max_mb, max_age_days in " in out, out
