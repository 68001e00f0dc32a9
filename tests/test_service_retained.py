"""A service on a retained cluster outlives the kernel that made it: after a kernel
restart, ``cluster.services`` gives a handle that routes and fans out to the same
replicas and restarts a failed one in place; ``%monarch status`` and ``%monarch service``
show its replicas. Real kernels, as the other retained-cluster tests."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from monarch_nb import cluster_dir
from monarch_nb.client.runtime import runtime
from conftest import cluster_processes, pids_alive, wait_until
from kernels import Kernel

ECHO_CELL = textwrap.dedent("""
    import json, os, signal
    import monarch_nb
    from monarch_nb.actor import Actor, endpoint

    class Echo(Actor):
        def __init__(self, tag):
            self.tag = tag

        @endpoint
        def echo(self, x):
            return (os.getpid(), self.tag, x)
""")


@pytest.fixture
def retained():
    """The name of the retained cluster a test starts; stopped afterwards, leaving nothing."""
    name = "svc-nb"
    yield name
    path = cluster_dir.cluster_path(name)
    subprocess.run([sys.executable, "-m", "monarch_nb.cli", "cluster", "stop", name], capture_output=True)
    assert wait_until(lambda: not cluster_processes(path), 15), cluster_processes(path)
    if runtime().cluster is not None:
        runtime().cluster.disconnect()
        runtime().cluster = None


def test_a_service_survives_a_kernel_restart_and_shows_in_the_magics(retained):
    kernel = Kernel()
    try:
        out = kernel.run(ECHO_CELL + textwrap.dedent(f"""
            cluster = monarch_nb.Cluster.start({retained!r})
            svc = Echo.options(procs=1, num_replicas=2, name="echo").as_service("t").wait_ready(60)
            for i in range(4):
                svc.echo.route(i).get(timeout=60)
            print(json.dumps([r.procs.pids[0] for r in svc.replicas]))
        """))
        pids = json.loads(out)
        kernel.run("%load_ext monarch_nb")
        view = kernel.run("%monarch service echo")
        rows = [line.split() for line in view.splitlines()[2:]]
        assert [row[:4] for row in rows] == [["0", "healthy", "2", "0"], ["1", "healthy", "2", "0"]], view
        status = kernel.run("%monarch status")
        assert "services (1)" in status and "echo  Echo · 2/2 replicas serving" in status, status

        kernel.restart()
        kernel.run("%load_ext monarch_nb")  # its failure hook would show an unhandled failure under the cell
        out = kernel.run(ECHO_CELL + textwrap.dedent(f"""
            from conftest import wait_until
            from monarch_nb.client.runtime import runtime
            cluster = monarch_nb.connect({retained!r})
            svc = cluster.services["echo"]
            print(json.dumps(sorted(pid for pid, _, _ in svc.echo.fanout(1).get(timeout=60))))
            print(json.dumps(svc.echo.route(2).get(timeout=60)[1:]))
            old = svc.replicas[0].procs.pids[0]
            os.kill(old, signal.SIGKILL)
            # no call had it in flight: without the service handling it, the hook would say it
            assert runtime().supervision.wait_heard(svc._cluster_id, svc.replicas[0].actors.name, 60)
            served = [svc.echo.route(i).get(timeout=60)[2] for i in range(6)]  # none fails: retried
            assert wait_until(lambda: svc.replicas[0].restarts > 0 and svc.wait_healthy(60), 60), svc.get_metrics()
            back = svc.echo.fanout(3).get(timeout=60)
            print(json.dumps([served, sorted(pid for pid, _, _ in back) != sorted([old, svc.replicas[1].procs.pids[0]]),
                              [tag for _, tag, _ in back]]))
        """))
        lines = out.splitlines()
        assert json.loads(lines[0]) == sorted(pids)  # the same replicas
        assert json.loads(lines[1]) == ["t", 2]
        served, replaced, tags = json.loads(lines[2])
        assert served == list(range(6)) and replaced and tags == ["t", "t"]  # made again with its arguments
        view = kernel.run("%monarch service echo")
        assert view.splitlines()[2].split()[:2] == ["0", "healthy"] and view.splitlines()[2].split()[6] == "1", view
        said = "".join(kernel.text(m, stream) for m in list(kernel.outputs) for stream in ("stdout", "stderr"))
        assert "unhandled failure" not in said, said
        kernel.run("svc.shutdown()")
        assert wait_until(lambda: not pids_alive(pids), 15)
    finally:
        kernel.shutdown()


def test_a_replica_that_died_while_no_client_held_the_service_is_restarted_when_one_takes_it(retained):
    import os
    import signal

    import monarch_nb
    from monarch_nb.service import ReplicaState, connect_service

    script = ECHO_CELL + textwrap.dedent(f"""
        cluster = monarch_nb.Cluster.start({retained!r})
        svc = Echo.options(procs=1, num_replicas=2, name="echo").as_service("t").wait_ready(60)
        print(json.dumps([r.procs.pids[0] for r in svc.replicas]))
    """)  # the script ends; its cluster and the service's replicas stay
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pids = json.loads(out.stdout)
    os.kill(pids[0], signal.SIGKILL)
    cluster = monarch_nb.connect(retained)
    assert wait_until(lambda: any(p["exit_code"] is not None for m in cluster.info()["proc_meshes"].values()
                                  for p in m["procs"]), 30)
    svc = connect_service("echo", cluster)
    try:
        assert wait_until(lambda: svc.replicas[0].restarts == 1 and svc.replicas[0].state is ReplicaState.HEALTHY,
                          60), svc.get_metrics()
        results = svc.echo.fanout("x").get(timeout=60)
        assert [tag for _, tag, _ in results] == ["t", "t"] and results[1][0] == pids[1]
        assert results[0][0] != pids[0]
        assert [svc.echo.route(i).get(timeout=60)[2] for i in range(4)] == [0, 1, 2, 3]
    finally:
        svc.shutdown()
    assert cluster.services == {}
