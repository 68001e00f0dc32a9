"""Retained clusters: meshes and actor state outlive the client (kernel restarts, new
kernels, scripts, a killed hub); clusters are found by name and stale files are caught."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

import monarch_nb
import monarch_nb.actor
from monarch_nb import cluster_dir
from monarch_nb.actor import this_host
from monarch_nb.client.runtime import runtime
from monarch_nb.client.hub_client import HubClient
from monarch_nb.errors import ClusterError, ClusterNotFound, InvalidRequest, SupervisionError
from monarch_nb.protocol import hub_ops

from conftest import cluster_processes, pids_alive, wait_until
from kernels import TESTS, Kernel
from monarch_nb.client.launch import launch_hub
from sample_actors import AsyncActor, Counter, Printer

COUNTER_CELL = textwrap.dedent("""
    import monarch_nb
    from monarch_nb.actor import Actor, endpoint, this_host, current_rank

    class Tally(Actor):
        def __init__(self, start):
            self.value = start

        @endpoint
        def add(self, n):
            self.value += n
            return self.value

        @endpoint
        def get(self):
            return (current_rank().rank, self.value)

        @endpoint
        def tagged(self, tag, i):
            return (tag, i, current_rank().rank)
""")


@pytest.fixture
def clusters():
    """Names of clusters a test starts; each is stopped afterwards, and nothing of it
    may be left running or on disk."""
    names: list[str] = []
    yield names
    for name in names:
        path = cluster_dir.cluster_path(name)
        subprocess.run([sys.executable, "-m", "monarch_nb.cli", "cluster", "stop", name], capture_output=True)
        assert wait_until(lambda: not cluster_processes(path), 15), cluster_processes(path)
        assert not path.exists(), f"{path} left behind"
    if runtime().cluster is not None:
        runtime().cluster.disconnect()
        runtime().cluster = None


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monarch_nb.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200"})


def _state(mesh) -> list:
    return sorted(mesh.get.call().get().values())


def test_actor_state_survives_kernel_restart_new_kernel_and_a_script(clusters):
    clusters.append("nb")
    kernel = Kernel()
    try:
        kernel.run(COUNTER_CELL + textwrap.dedent("""
            cluster = monarch_nb.Cluster.start("nb")
            procs = this_host().spawn_procs(per_host={"gpus": 4}, name="workers")
            tallies = procs.spawn("tallies", Tally, 10)
            tallies.add.call(5).get()
            tallies.slice(gpus=2).add.call(100).get()
            print(procs.pids)
        """))
        expected = "[(0, 15), (1, 15), (2, 115), (3, 15)]"
        pids = json.loads(kernel.run("print(procs.pids)"))
        old_kernel = kernel.pid

        kernel.restart()
        assert not pids_alive([old_kernel])
        read_back = "import monarch_nb\nc = monarch_nb.connect()\nprint(sorted(c.actor_meshes['tallies'].get.call().get().values()))"
        assert kernel.run(read_back).strip() == expected

        # A brand-new kernel re-runs the notebook's cells: same procs, same actors, state kept.
        kernel.shutdown()
        kernel = Kernel()
        out = kernel.run(COUNTER_CELL + textwrap.dedent("""
            cluster = monarch_nb.connect("nb")
            procs = this_host().spawn_procs(per_host={"gpus": 4}, name="workers")
            tallies = procs.spawn("tallies", Tally, 10)
            print(procs.pids)
            print(sorted(tallies.get.call().get().values()))
        """))
        assert out.split("\n")[:2] == [str(pids), expected]
    finally:
        kernel.shutdown()

    script = "import monarch_nb; c = monarch_nb.connect('nb'); print(sorted(c.actor_meshes['tallies'].get.call().get().values()))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=TESTS)
    assert out.stdout.strip() == expected, out.stderr
    assert pids_alive(pids) == pids


def test_a_script_that_exits_right_after_its_calls_shows_every_line_they_caused(clusters):
    # Lines reach the client apart from replies: a script that exits at once used to show
    # 4-5 of these 24 (all were in the store). At exit it drains them, as a cell does.
    clusters.append("drain")
    monarch_nb.Cluster.start("drain").disconnect()
    script = textwrap.dedent("""
        import monarch_nb
        from monarch_nb.actor import this_host
        from sample_actors import Printer
        monarch_nb.connect("drain")
        printers = this_host().spawn_procs(per_host={"gpus": 8}, name="drain").spawn("printers", Printer)
        for call in range(3):
            printers.numbered.call(1).get()  # "rRANK line 0" from each rank
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, cwd=TESTS)
    assert out.returncode == 0, out.stderr
    shown = [line for line in out.stdout.splitlines() if line.endswith(" line 0")]
    assert len(shown) == 24, out.stdout


def test_a_stopped_clusters_lines_stay_readable_from_python_and_the_cli(clusters):
    # cluster.stop() deleted the log store with everything else (issue 23).
    clusters.append("kept")
    cluster = monarch_nb.Cluster.start("kept")
    try:
        printers = this_host().spawn_procs(per_host={"gpus": 4}, name="kept").spawn("printers", Printer)
        printers.say.call(["kept after the stop"]).get()
    finally:
        cluster.stop()
    assert sorted(r["rank"] for r in cluster.logs(mesh="printers", grep="^kept after")) == [0, 1, 2, 3]
    cli = [sys.executable, "-m", "monarch_nb.cli", "logs", "kept", "printers", "--grep", "^kept after"]
    folded = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert folded.returncode == 0 and folded.stdout.strip() == "[printers 0-3] kept after the stop", folded.stderr
    unfolded = subprocess.run([*cli, "--fold", "off"], capture_output=True, text=True, timeout=60)
    assert sorted(unfolded.stdout.splitlines()) == [f"[printers {r}] kept after the stop" for r in range(4)]
    never = subprocess.run([sys.executable, "-m", "monarch_nb.cli", "logs", "never-started"], capture_output=True,
                           text=True, timeout=60)
    assert never.returncode == 1 and "no log store is kept" in never.stderr


def test_the_cli_names_a_mesh_that_is_not_there_and_fails(clusters):
    # `monarch-nb logs CLUSTER nosuchmesh` exited 0 printing nothing (a new-user trial).
    clusters.append("meshes")
    monarch_nb.Cluster.start("meshes")
    this_host().spawn_procs(per_host={"gpus": 2}, name="known").spawn("printers", Printer)
    out = subprocess.run([sys.executable, "-m", "monarch_nb.cli", "logs", "meshes", "nosuchmesh"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == "", out.stderr
    assert "no mesh 'nosuchmesh'" in out.stderr and "(meshes: known, known/printers)" in out.stderr, out.stderr
    quiet = subprocess.run([sys.executable, "-m", "monarch_nb.cli", "logs", "meshes", "printers"], capture_output=True,
                           text=True, timeout=60)
    assert quiet.returncode == 0, quiet.stderr  # a mesh that printed nothing yet is no mistake


def test_two_kernels_calling_one_mesh_at_once_each_get_only_their_replies(clusters):
    clusters.append("shared")
    cluster = monarch_nb.Cluster.start("shared")
    cluster.host_mesh().spawn_procs(per_host={"gpus": 2}, name="p")
    kernels = [Kernel(), Kernel()]
    try:
        for k in kernels:
            k.run(COUNTER_CELL + "c = monarch_nb.connect('shared')\n"
                  "m = c.proc_meshes['p'].spawn('tallies', Tally, 0)")
        loop = textwrap.dedent("""
            seen = []
            for i in range(300):
                seen += m.tagged.call({tag!r}, i).get().values()
            assert seen == [({tag!r}, i, r) for i in range(300) for r in range(2)], seen[:4]
            print("ok", len(seen))
        """)
        results = {}
        threads = [threading.Thread(target=lambda k=k, t=t: results.__setitem__(t, k.run(loop.format(tag=t))))
                   for k, t in zip(kernels, ("left", "right"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert results == {"left": "ok 600\n", "right": "ok 600\n"}
        clients = {c["pid"] for c in cluster.info()["clients"]}
        assert {k.pid for k in kernels} | {os.getpid()} <= clients
    finally:
        for k in kernels:
            k.shutdown()


def _spawn_counters(name: str, grace_s: float):
    cluster = monarch_nb.Cluster.start(name, grace_s=grace_s)
    procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 2}, name="p")
    counters = procs.spawn("counters", Counter, 3)
    counters.incr.call(4).get()
    return cluster, procs, counters


def test_a_fresh_client_connects_to_the_live_actors_of_the_mesh_it_picks_before_calling(clusters):
    clusters.append("ahead")
    cluster, procs, counters = _spawn_counters("ahead", grace_s=30)
    procs.spawn("steps", AsyncActor)
    os.kill(procs.pids[1], signal.SIGKILL)
    assert wait_until(lambda: cluster.info()["actor_meshes"]["p/counters"]["dead"], 15)
    script = textwrap.dedent("""
        import json, monarch_nb
        from monarch_nb.client.runtime import runtime
        c = monarch_nb.connect("ahead")
        meshes = c.actor_meshes
        sockets = runtime().mailbox.outbox._table().sockets
        addresses = {key: mesh._addresses for key, mesh in meshes.items()}  # (not lookups)
        listed = [a in sockets for a in addresses["p/counters"]]
        meshes["counters"]
        picked = [a in sockets for a in addresses["p/counters"]]
        steps = meshes["steps"].slice(gpus=0)  # async actors, asked to connect back as well
        print(json.dumps([listed, picked, list(steps.step.call(5, 0).get().values())]))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=TESTS)
    assert out.returncode == 0, out.stderr
    listed, picked, stepped = json.loads(out.stdout.strip().splitlines()[-1])
    assert listed == [False, False]  # listing the meshes connects to none
    assert picked == [True, False]  # the one picked: its live actor, not the dead one
    assert stepped == [5]
    assert cluster.flush_logs()
    assert not cluster.logs(grep="could not handle|unknown message kind")  # every actor took the connect


def test_hub_killed_and_recovered_keeps_every_mesh_and_actor_state(clusters):
    clusters.append("phoenix")
    cluster, procs, counters = _spawn_counters("phoenix", grace_s=30)
    agents = [h["pid"] for h in cluster.info()["hosts"]]
    payloads = sorted(p.name for p in (cluster.path / "spawn").iterdir())
    orphan = cluster.path / "spawn" / "spawned-as-the-hub-died.bin"  # as a spawn cut short leaves it
    orphan.write_bytes(b"x" * 1024)

    os.kill(cluster._info["hub_pid"], signal.SIGKILL)
    with pytest.raises(ClusterNotFound, match="not running.*recover"):
        monarch_nb.connect("phoenix")
    assert "stale" in _cli("cluster", "list").stdout
    recovered = _cli("cluster", "recover", "phoenix")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert "recovered; 1 proc mesh(es) kept: p" in recovered.stdout
    assert sorted(p.name for p in (cluster.path / "spawn").iterdir()) == payloads  # the orphan went

    again = monarch_nb.connect("phoenix")
    assert again.proc_meshes["p"].pids == procs.pids
    with pytest.raises(KeyError, match=r"no proc mesh 'zzz' \(proc meshes: p\)"):
        again.proc_meshes["zzz"]
    assert _state(again.actor_meshes["counters"]) == [7, 7]
    assert _state(counters) == [7, 7]  # handles held from before the crash still work
    assert [h["pid"] for h in again.info()["hosts"]] == agents

    # Killed again: starting the name re-adopts automatically while its procs live.
    os.kill(again._info["hub_pid"], signal.SIGKILL)
    runtime().cluster = None
    third = monarch_nb.Cluster.start("phoenix")
    assert _state(third.actor_meshes["counters"]) == [7, 7]
    more = third.proc_meshes["p"].spawn("more", Counter, 1)  # the recovered hub spawns too
    assert _state(more) == [1, 1]
    status = _cli("cluster", "status", "phoenix").stdout
    assert "counters" in status and "more" in status and "2/2 healthy" in status
    third.stop()
    assert not pids_alive(procs.pids + agents)
    assert not third.path.exists()


def test_a_hub_recovered_while_one_host_is_dead_keeps_the_live_hosts_and_their_state(clusters):
    # The recovering hub put the hosts that answered in its registry with the dead hub's
    # last_seen, after waiting ADOPT_TIMEOUT_S on the dead one: its first heartbeat found
    # every live host silent past HOST_TIMEOUT_S, failed all their procs and calls, and
    # took them back a second later (Slurm and local hosts: every time).
    clusters.append("onedead")
    cluster = monarch_nb.Cluster.start("onedead", hosts=3, grace_s=30)
    hosts = cluster.host_mesh()
    counters = [hosts.slice(hosts=h).spawn_procs(per_host={"gpus": 1}, name=f"p{h}").spawn("c", Counter, 10 * h)
                for h in (0, 2)]
    for mesh in counters:
        mesh.incr.call(1).get(timeout=60)
    os.kill(cluster.info()["hosts"][1]["pid"], signal.SIGKILL)  # host1's agent: a dead host
    assert wait_until(lambda: cluster.info()["hosts"][1]["lost"], 60)
    os.kill(cluster._info["hub_pid"], signal.SIGKILL)
    recovered = _cli("cluster", "recover", "onedead")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    again = monarch_nb.connect("onedead")
    started, rounds = time.monotonic(), 0
    while time.monotonic() - started < 8:  # past the heartbeats that failed every live host
        for mesh in counters:
            mesh.incr.call(1).get(timeout=60)
        rounds += 1
    assert [m.get.call_one().get(timeout=60) for m in counters] == [1 + rounds, 21 + rounds]  # state kept
    log = (cluster.path / "hub.log").read_text(errors="replace")
    assert not re.search(r"host agent host[02] .*procs are lost", log), log[-3000:]
    assert not [h for h in again.info()["hosts"] if h["lost"]]  # host1 dropped, host0 and host2 live


def test_a_recover_whose_hub_died_before_it_was_ready_can_be_recovered_again(clusters):
    # The recovering hub writes cluster.json without the hub's address until it is
    # ready; one that died then (killed, or failed adopting) left a cluster that
    # recover() called "no state to recover": every mesh lost.
    clusters.append("twice")
    cluster, procs, counters = _spawn_counters("twice", grace_s=30)
    agents = [h["pid"] for h in cluster.info()["hosts"]]
    os.kill(cluster._info["hub_pid"], signal.SIGKILL)
    for pid in agents:  # the new hub waits for them to answer its adopt
        os.kill(pid, signal.SIGSTOP)
    try:
        first = subprocess.Popen([sys.executable, "-m", "monarch_nb.cli", "cluster", "recover", "twice"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        info = lambda: cluster_dir.read_info(cluster.path)  # noqa: E731
        assert wait_until(lambda: info().get("hub_pid") not in (None, cluster._info["hub_pid"]), 30)
        assert "hub" not in info()  # not ready: adopting
        os.kill(info()["hub_pid"], signal.SIGKILL)
        assert first.wait(60) != 0
    finally:
        for pid in agents:
            os.kill(pid, signal.SIGCONT)
    again = _cli("cluster", "recover", "twice")
    assert again.returncode == 0, again.stdout + again.stderr
    assert _state(counters) == [7, 7]  # at its old address: handles from before still work


def test_a_death_a_recovering_hub_learns_reaches_a_client_that_joined_it_while_it_adopted(clusters):
    # The new hub serves (and takes in clients) while it adopts: a client that joined
    # then was told what had died before adoption found this proc gone, and never after;
    # its calls to that rank waited for ever (a fresh client's failed at once).
    clusters.append("heard")
    cluster, procs, counters = _spawn_counters("heard", grace_s=30)
    agent = cluster.info()["hosts"][0]["pid"]
    os.kill(cluster._info["hub_pid"], signal.SIGSTOP)
    os.kill(procs.pids[0], signal.SIGKILL)  # its agent's news of it dies with the hub, unread
    assert wait_until(lambda: not pids_alive(procs.pids[:1]), 30)  # reaped: adoption finds it gone
    os.kill(cluster._info["hub_pid"], signal.SIGKILL)
    os.kill(agent, signal.SIGSTOP)  # its answer to the new hub's adopt waits
    hub = HubClient(cluster._info["cluster_id"], cluster._info["hub"])

    def joined() -> bool:
        try:
            return runtime().client_id in [c["client_id"] for c in hub.request(hub_ops.INFO, timeout=1)["clients"]]
        except ClusterError:
            return False

    try:
        recovering = subprocess.Popen([sys.executable, "-m", "monarch_nb.cli", "cluster", "recover", "heard"],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert wait_until(joined, 30)  # this client's presence found the new hub, still adopting
    finally:
        os.kill(agent, signal.SIGCONT)
    assert recovering.wait(60) == 0, recovering.stdout.read()
    with pytest.raises(SupervisionError, match="killed by SIGKILL"):
        counters.get.call().get(timeout=30)
    assert counters.slice(gpus=1).get.call_one().get(timeout=30) == 7


def test_hub_killed_and_not_recovered_leaves_no_process_after_grace(clusters):
    clusters.append("orphan")
    cluster, procs, _ = _spawn_counters("orphan", grace_s=1.0)
    agents = [h["pid"] for h in cluster.info()["hosts"]]
    os.kill(cluster._info["hub_pid"], signal.SIGKILL)
    assert wait_until(lambda: not pids_alive(agents + procs.pids), 1.0 + 5)
    with pytest.raises(ClusterNotFound, match="monarch-nb cluster stop orphan"):
        monarch_nb.connect("orphan")
    assert _cli("cluster", "stop", "orphan").returncode == 0
    assert not cluster.path.exists()


def test_stop_leaves_no_process_and_no_file(clusters):
    clusters.append("tidy")
    cluster, procs, _ = _spawn_counters("tidy", grace_s=10)
    everything = [p.pid for p in cluster_processes(cluster.path)]
    assert len(everything) == 5  # hub, host agent, its forkserver, two procs
    cluster.stop()
    assert not pids_alive(everything)
    assert not cluster.path.exists()
    assert "tidy" not in [c["name"] for c in monarch_nb.list_clusters()]
    assert not list(cluster_dir.clusters_root().glob(".tidy.lock"))  # no empty lock file either


@pytest.mark.parametrize("pid_kind", ["dead", "reused"])
def test_stale_cluster_json_is_reported_not_trusted(clusters, pid_kind):
    name = f"ghost-{pid_kind}"
    clusters.append(name)
    path, info = cluster_dir.create(name)
    if pid_kind == "dead":
        gone = subprocess.Popen(["true"])
        gone.wait()
        pid, created = gone.pid, 0.0
    else:  # a live process that is not the hub that wrote the file
        pid, created = os.getpid(), psutil.Process().create_time() - 100
    cluster_dir.write_json(path / "cluster.json", {
        **info, "hub": "tcp://127.0.0.1:9", "hub_pid": pid, "hub_create_time": created,
        "hostname": socket.gethostname()})
    reason = "is not running" if pid_kind == "dead" else "belongs to another process"
    with pytest.raises(ClusterNotFound, match=reason):
        monarch_nb.connect(name)
    [listed] = [c for c in monarch_nb.list_clusters() if c["name"] == name]
    assert listed["state"] == "stale" and reason in listed["reason"]
    # Starting that name clears the stale directory and starts afresh.
    fresh = monarch_nb.Cluster.start(name)
    assert fresh._info["cluster_id"] != info["cluster_id"]
    assert fresh.host_mesh().spawn_procs(per_host={"gpus": 1}).pids


def test_connect_by_name_and_without_one(clusters):
    with pytest.raises(ClusterNotFound, match="no cluster named 'nope'; no cluster is running"):
        monarch_nb.connect("nope")
    clusters += ["alpha", "beta"]
    monarch_nb.Cluster.start("alpha").disconnect()
    assert monarch_nb.connect().name == "alpha"  # the only one running
    monarch_nb.Cluster.start("beta").disconnect()
    with pytest.raises(ClusterNotFound, match="several clusters are running \\(alpha, beta\\)"):
        monarch_nb.connect()
    with pytest.raises(ClusterNotFound, match="running: alpha, beta"):
        monarch_nb.connect("gamma")
    with pytest.raises(InvalidRequest, match="already running with 1 host"):
        monarch_nb.Cluster.start("alpha", hosts=2)
    beta = monarch_nb.Cluster.start("beta")  # re-running the cell connects
    assert this_host()._hub_address == beta._info["hub"]


def test_idle_timeout_stops_a_cluster_once_no_client_is_left(clusters):
    clusters.append("idle")
    cluster = monarch_nb.Cluster.start("idle", idle_timeout=0.5)
    procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 1})
    hub = psutil.Process(cluster._info["hub_pid"])
    # Connected for several idle periods: still running.
    assert wait_until(lambda: cluster.info()["clients"] and _uptime(cluster) > 2.0, 10)
    assert procs.spawn("c", Counter, 1).get.call_one().get() == 1
    cluster.disconnect()
    assert wait_until(lambda: not pids_alive([hub.pid] + procs.pids), 10)
    assert wait_until(lambda: not cluster.path.exists(), 5)


def test_idle_timeout_waits_for_the_starting_clients_first_hello(clusters):
    # On a loaded machine the client that started a cluster may say hello seconds after
    # the hub is ready: a short idle timeout must not stop the cluster before that.
    clusters.append("late")
    path, _ = cluster_dir.create("late")
    launch_hub(path, hosts=1, grace_s=5.0, idle_timeout=0.5)
    hub = psutil.Process(cluster_dir.read_info(path)["hub_pid"])
    time.sleep(1.5)  # the late hello itself (three idle timeouts), not a wait for a condition
    assert pids_alive([hub.pid]) == [hub.pid], "the hub stopped before its first client came"
    cluster = monarch_nb.connect("late")
    assert cluster.host_mesh().spawn_procs(per_host={"gpus": 1}).spawn("c", Counter, 4).get.call_one().get() == 4
    cluster.disconnect()
    assert wait_until(lambda: not pids_alive([hub.pid]), 15)


def _uptime(cluster) -> float:
    return time.time() - cluster.info()["hub_started"]


def test_client_that_dies_mid_call_does_not_disturb_the_actor_or_others(clusters):
    clusters.append("survivor")
    cluster, procs, counters = _spawn_counters("survivor", grace_s=10)
    script = textwrap.dedent("""
        import os, monarch_nb
        c = monarch_nb.connect("survivor")
        m = c.actor_meshes["counters"]
        futures = [m.slow_echo.call(i, 0.2) for i in range(10)]
        futures[0].get()
        os._exit(0)  # vanish with nine calls outstanding
    """)
    subprocess.run([sys.executable, "-c", script], timeout=60, cwd=TESTS, check=True)
    # The actors finish the dead client's work (replies go nowhere), then serve us.
    assert counters.incr.call(1).get().values() == [8, 8]
    assert counters.slow_echo.call("x", 0).get().values() == ["x", "x"]
    assert wait_until(lambda: len(cluster.info()["clients"]) == 1, 10)


def test_cli_starts_lists_shows_and_stops_a_cluster(clusters):
    clusters.append("cli")
    started = _cli("cluster", "start", "cli", "--hosts", "2", "--grace", "5")
    assert started.returncode == 0, started.stdout + started.stderr
    assert _cli("cluster", "start", "cli").returncode == 0  # already running: fine
    clash = _cli("cluster", "start", "cli", "--hosts", "3")
    assert clash.returncode == 1 and "already running with 2 host(s)" in clash.stdout
    cluster = monarch_nb.connect("cli")
    cluster.host_mesh().spawn_procs(per_host={"gpus": 3}, name="trio").spawn("count", Counter)
    [row] = [line for line in _cli("cluster", "list").stdout.splitlines() if " cli " in line]
    assert [cell.strip() for cell in row.split("│")[2:7]] == ["running", "2", "6/6", "1", "1"]
    status = _cli("cluster", "status", "cli").stdout
    assert "hosts=2 × gpus=3" in status and "6/6 healthy" in status and "sample_actors.Counter" in status
    assert _cli("cluster", "stop", "cli").returncode == 0
    assert not cluster.path.exists()
    missing = _cli("cluster", "status", "cli")
    assert missing.returncode == 1 and "not running" in missing.stdout


def test_clients_starting_one_name_at_once_share_one_cluster(clusters):
    clusters.append("race")
    script = "import monarch_nb; c = monarch_nb.Cluster.start('race'); print(c._info['cluster_id'], c._info['hub_pid'])"
    starters = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for _ in range(4)]
    outputs = [p.communicate(timeout=120) for p in starters]
    assert [p.returncode for p in starters] == [0] * 4, [err for _, err in outputs]
    assert len({out for out, _ in outputs}) == 1
    hubs = [p for p in cluster_processes(cluster_dir.cluster_path("race")) if "monarch_nb.hub" in p.cmdline()]
    assert [h.pid for h in hubs] == [int(outputs[0][0].split()[1])]


@pytest.mark.parametrize("kwargs, message", [
    ({"name": ""}, "bad cluster name ''"),
    ({"name": "a/b"}, "bad cluster name 'a/b'"),
    ({"name": ".hidden"}, "starting with a letter or digit"),
    ({"name": "x" * 65}, "1-64 letters"),
    ({"name": "ephemeral-x"}, "kept for scripts' ephemeral clusters"),
    ({"name": "ok", "hosts": 0}, "at least 1 host"),
    ({"name": "ok", "idle_timeout": -1}, "idle_timeout=-1"),
    ({"name": "ok", "grace_s": 0}, "grace_s=0"),
    ({"name": "ok", "hosts": 10**6}, "hosts=1000000: local hosts are host agent processes on this machine"),
])
def test_bad_start_arguments_are_refused_before_anything_starts(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        monarch_nb.Cluster.start(**kwargs)
    assert not [c for c in monarch_nb.list_clusters() if c["name"] == kwargs["name"]]
    assert not cluster_dir.clusters_root().joinpath("ok").exists()


def test_cli_reports_a_bad_name_in_one_line():
    out = _cli("cluster", "stop", "a/b")
    assert out.returncode == 1 and "bad cluster name 'a/b'" in out.stdout and "Traceback" not in out.stderr


def test_requests_to_a_dead_hub_fail_within_seconds_not_at_timeout(clusters):
    clusters.append("fastfail")
    cluster = monarch_nb.Cluster.start("fastfail", grace_s=30)
    procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 1}, name="p")
    os.kill(cluster._info["hub_pid"], signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(monarch_nb.actor.ClusterError, match="hub of cluster 'fastfail' is gone.*recover"):
        procs.spawn("c", Counter)
    assert time.monotonic() - started < 10  # the request's own timeout is unlimited
    recovered = monarch_nb.Cluster.recover("fastfail")
    assert _state(procs.spawn("c", Counter, 5)) == [5]  # the same handle works again
    recovered.stop()


def test_calls_on_a_cluster_whose_hub_died_fail_after_its_grace_and_work_after_recovery(clusters):
    # Nothing is left to report the actors' deaths once the hub is gone and its agents
    # stopped every proc: calls waited until their timeout (for ever without one).
    clusters.append("hubless")
    cluster = monarch_nb.Cluster.start("hubless", grace_s=2)
    procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 1}, name="p")
    counter = procs.spawn("c", Counter)
    waiting = counter.slow_echo.call_one("x", 30)
    os.kill(cluster._info["hub_pid"], signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(monarch_nb.actor.SupervisionError, match="hub of cluster 'hubless' died.*cluster recover"):
        waiting.get(timeout=60)
    assert time.monotonic() - started < 20  # grace 2 s; the call itself would run 30 s
    started = time.monotonic()
    with pytest.raises(monarch_nb.actor.SupervisionError, match="hub of cluster 'hubless' died"):
        counter.incr.call_one().get(timeout=60)
    assert time.monotonic() - started < 10  # at once, not at the call's timeout
    recovered = monarch_nb.Cluster.recover("hubless")
    # The new hub forgot the mesh (every proc of it was gone): calls through the old
    # handle fail, saying so, instead of waiting for ever once the hub is back.
    with pytest.raises(monarch_nb.actor.SupervisionError, match="was gone when a new hub took the cluster over"):
        counter.incr.call_one().get(timeout=30)
    fresh = recovered.host_mesh().spawn_procs(per_host={"gpus": 1}, name="q").spawn("c2", Counter, 7)
    assert fresh.get.call_one().get(timeout=60) == 7
    recovered.stop()


def test_hub_repairs_a_damaged_cluster_json_and_stops_when_its_directory_goes(clusters):
    clusters.append("selfheal")
    cluster = monarch_nb.Cluster.start("selfheal")
    good = (cluster.path / "cluster.json").read_text()
    (cluster.path / "cluster.json").write_text("{not json")
    assert wait_until(lambda: (cluster.path / "cluster.json").read_text() == good, 10)
    assert monarch_nb.connect("selfheal").info()["name"] == "selfheal"
    everything = [p.pid for p in cluster_processes(cluster.path)]
    shutil.rmtree(cluster.path)
    assert wait_until(lambda: not pids_alive(everything), 15)


def test_a_recovered_hub_keeps_procs_that_were_restarted(clusters):
    clusters.append("reborn")
    cluster, procs, counters = _spawn_counters("reborn", grace_s=30)
    old = procs.pids
    os.kill(old[0], signal.SIGKILL)
    assert wait_until(lambda: cluster.health()["counts"]["failed"] == 1, 10)
    assert procs.restart_failed() == [0]
    restarted = cluster.proc_meshes["p"].pids
    os.kill(cluster._info["hub_pid"], signal.SIGKILL)
    runtime().cluster = None
    recovered = monarch_nb.Cluster.recover("reborn")
    tree = recovered.health()
    assert tree["counts"]["failed"] == 0 and tree["summary"].startswith("2/2 procs healthy"), tree["summary"]
    assert recovered.proc_meshes["p"].pids == restarted and restarted[1] == old[1]
    assert _state(recovered.actor_meshes["counters"]) == [3, 7]  # the restarted one from its arguments


def test_calls_on_a_cluster_another_client_stopped_say_the_cluster_was_stopped(clusters):
    clusters.append("stopped_elsewhere")
    cluster = monarch_nb.Cluster.start("stopped_elsewhere")
    counter = cluster.host_mesh().spawn_procs(per_host={"gpus": 1}, name="p").spawn("c", Counter, 0)
    stop = subprocess.run([sys.executable, "-m", "monarch_nb.cli", "cluster", "stop", "stopped_elsewhere"],
                          capture_output=True, text=True, timeout=120)
    assert stop.returncode == 0, stop.stderr
    with pytest.raises(monarch_nb.actor.SupervisionError,
                       match="was stopped with its cluster 'stopped_elsewhere': start or connect"):
        counter.incr.call_one().get(timeout=30)


def test_spawn_procs_on_the_hosts_of_a_cluster_stopped_before_says_to_start_or_connect(clusters):
    # It said "cluster 'stopped_here' was stopped while this request waited", though the
    # cluster was stopped before the request.
    clusters.append("stopped_here")
    cluster = monarch_nb.Cluster.start("stopped_here")
    hosts = this_host()
    cluster.stop()
    with pytest.raises(ClusterError, match=r"^cluster 'stopped_here' was stopped \(by this client\): "
                                           r"start or connect to a cluster$"):
        hosts.spawn_procs(per_host={"gpus": 1})


def test_connect_to_a_paused_hub_says_it_does_not_answer_and_recover_leaves_it_alive(clusters):
    # connect() said "not running ... recover it with Cluster.recover(...)", and recover()
    # SIGKILLed a hub that did not answer: following the hint killed a live hub.
    clusters.append("paused")
    cluster, procs, counters = _spawn_counters("paused", grace_s=60)
    hub_pid = cluster._info["hub_pid"]
    runtime().cluster = None
    os.kill(hub_pid, signal.SIGSTOP)
    try:
        with pytest.raises(monarch_nb.actor.ClusterError, match=rf"hub \(pid {hub_pid}\) is running but does not "
                                                                 r"answer.*try again") as refused:
            monarch_nb.connect("paused")
        assert "not running" not in str(refused.value) and "force=True" in str(refused.value)
        with pytest.raises(InvalidRequest, match=rf"hub \(pid {hub_pid}\) is alive.*force=True"):
            monarch_nb.Cluster.recover("paused")
        cli = _cli("cluster", "recover", "paused")
        assert cli.returncode == 1 and "--force" in cli.stdout, cli.stdout + cli.stderr
        assert pids_alive([hub_pid]) == [hub_pid]
    finally:
        os.kill(hub_pid, signal.SIGCONT)
    again = monarch_nb.connect("paused")
    assert again._info["hub_pid"] == hub_pid and _state(again.actor_meshes["counters"]) == [7, 7]


def test_recover_with_force_replaces_a_hub_that_does_not_answer(clusters):
    clusters.append("wedged")
    cluster, procs, counters = _spawn_counters("wedged", grace_s=60)
    hub_pid = cluster._info["hub_pid"]
    runtime().cluster = None
    os.kill(hub_pid, signal.SIGSTOP)
    try:
        recovered = monarch_nb.Cluster.recover("wedged", force=True)
    finally:
        if pids_alive([hub_pid]):
            os.kill(hub_pid, signal.SIGCONT)
    assert not pids_alive([hub_pid]) and recovered._info["hub_pid"] != hub_pid
    assert _state(recovered.actor_meshes["counters"]) == [7, 7]


def test_the_cli_refuses_a_negative_tail_and_ranks_the_mesh_lacks_and_tails_shown_lines(clusters):
    # A new-user trial: `--tail -1` dropped a line, `--ranks 9` of a 2-rank mesh printed
    # nothing with exit 0, and `--tail 2` showed rank 0's last line as if rank 1 never printed.
    clusters.append("tails")
    cluster = monarch_nb.Cluster.start("tails")
    printers = this_host().spawn_procs(per_host={"gpus": 2}, name="two").spawn("printers", Printer)
    printers.say.call(["line 1", "line 2"]).get()
    assert wait_until(lambda: len(cluster.logs(mesh="printers")) == 4, 30)  # in the store
    logs = [sys.executable, "-m", "monarch_nb.cli", "logs", "tails", "printers"]
    negative = subprocess.run([*logs, "--tail", "-1"], capture_output=True, text=True, timeout=60)
    assert negative.returncode == 2 and "argument --tail: give a number of lines >= 1, not -1" in negative.stderr
    beyond = subprocess.run([*logs, "--ranks", "9"], capture_output=True, text=True, timeout=60)
    assert beyond.returncode == 1 and beyond.stdout == "", beyond.stderr
    assert "mesh 'printers': bad rank spec '9': rank 9 is out of range for 2 ranks (0-1)" in beyond.stderr
    tail = subprocess.run([*logs, "--tail", "2"], capture_output=True, text=True, timeout=60)
    assert tail.returncode == 0 and tail.stdout.splitlines() == ["[printers 0-1] line 1", "[printers 0-1] line 2"], \
        tail.stderr


@pytest.mark.parametrize("kind", ["missing parent", "file"])
def test_a_home_that_cannot_be_a_folder_is_named_with_the_fix(tmp_path, monkeypatch, kind):
    # A new-user trial: MONARCH_NB_HOME=/proc/nope (or a file) printed a 20-36-line
    # FileNotFoundError/NotADirectoryError traceback from pathlib.
    home = Path("/proc/nope") if kind == "missing parent" else tmp_path / "a-file"
    if kind == "file":
        home.write_text("")
    monkeypatch.setenv("MONARCH_NB_HOME", str(home))
    said = rf"MONARCH_NB_HOME={re.escape(str(home))} can't hold monarch_nb's files \(.*\); set MONARCH_NB_HOME to"
    with pytest.raises(ValueError, match=said):
        monarch_nb.Cluster.start("x")
    with pytest.raises(ValueError, match=said):
        monarch_nb.Cluster.start_ephemeral()
    out = subprocess.run([sys.executable, "-m", "monarch_nb.cli", "cluster", "start", "x"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1 and re.fullmatch(rf"monarch-nb cluster start: {said}[^\n]*\n", out.stdout), out
    assert out.stderr == ""
