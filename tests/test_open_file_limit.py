"""The open-file limit: every process of a cluster raises its soft limit to its hard one,
and a spawn that would not fit under the hard limit is refused at once, saying the limit
and how to raise it (256 procs under the common soft limit of 1,024 failed after 85 s
with "could not start procs on host0: " and nothing after the colon)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap

from monarch_nb import fd_limit

from conftest import cluster_processes, wait_until
from kernels import TESTS

# The script runs in a process whose limits the test sets, and so does every process of its
# cluster (inherited); it reports as JSON lines, and stops its ephemeral cluster at exit.
SCRIPT = textwrap.dedent("""
    import json, os, sys, psutil
    from monarch_nb.actor import ActorError, MonarchNbError, this_host
    from monarch_nb.client.cluster import default_cluster
    from sample_actors import Counter

    def report(**fields):
        print(json.dumps(fields), flush=True)

    def limits(pid):
        with open(f"/proc/{pid}/limits") as f:
            return [int(line.split()[3]) for line in f if line.startswith("Max open files")][0]

    cluster = default_cluster()
    report(path=str(cluster.path))
    try:
        procs = this_host().spawn_procs(per_host={"gpus": int(sys.argv[1])}, name="many")
        report(spawned=len(procs.pids), sum=sum(procs.spawn("c", Counter, 1).incr.call(1).get().values()))
    except MonarchNbError as e:
        report(error=str(e))
    few = this_host().spawn_procs(per_host={"gpus": 2}, name="few")
    report(few=sum(few.spawn("c", Counter, 5).incr.call(1).get().values()), health=cluster.health()["summary"])
    kinds = {}
    for p in [psutil.Process()] + psutil.Process().children(recursive=True):
        line = " ".join(p.cmdline())
        if p.pid == os.getpid():
            kind = "client"
        elif p.cmdline()[1:3] == ["-m", "monarch_nb.host.forkserver"]:  # it, or a proc it forked
            kind = "proc" if p.parent().cmdline()[1:3] == ["-m", "monarch_nb.host.forkserver"] else "forkserver"
        else:
            kind = next((k for k in ("hub", "host", "proc") if f"monarch_nb.{k}" in line), "client")
        kinds.setdefault(kind, limits(p.pid))
    report(soft_limits=kinds)
""")


def _run_limited(soft: int, hard: int, procs: int) -> list[dict]:
    """Run SCRIPT under RLIMIT_NOFILE (soft, hard) spawning ``procs``; its reports. Every
    process of its cluster is gone afterwards."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    out = subprocess.run([sys.executable, "-c", SCRIPT, str(procs)], capture_output=True, text=True, timeout=600,
                         cwd=TESTS, preexec_fn=limit)
    reports = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert reports and "path" in reports[0], out.stdout + out.stderr
    assert wait_until(lambda: not cluster_processes(reports[0]["path"]), 30), cluster_processes(reports[0]["path"])
    assert out.returncode == 0, out.stdout + out.stderr
    return reports


def test_procs_over_the_soft_open_file_limit_start_when_the_hard_limit_allows():
    # 24 procs need ~100 descriptors in their host agent: over a soft limit of 64.
    reports = _run_limited(64, 4096, 24)
    assert {"spawned": 24, "sum": 48} in reports, reports
    [limits] = [r["soft_limits"] for r in reports if "soft_limits" in r]
    assert limits == {"client": 4096, "hub": 4096, "host": 4096, "forkserver": 4096, "proc": 4096}


def test_a_spawn_over_the_hard_open_file_limit_says_the_limit_and_how_to_raise_it():
    reports = _run_limited(128, 128, 40)
    [error] = [r["error"] for r in reports if "error" in r]
    assert "can't hold 40 more procs under its limit of 128 open files (RLIMIT_NOFILE, hard limit 128)" in error
    assert "ulimit -Hn" in error and "LimitNOFILE" in error, error
    # Nothing was started, and the cluster serves on.
    [after] = [r for r in reports if "few" in r]
    assert after["few"] == 12 and after["health"].startswith("2/2 procs healthy"), reports


def test_spawn_problem_counts_procs_not_yet_talked_to_and_says_the_room_left():
    assert fd_limit.spawn_problem("hub", existing=100, new=100, soft=1024, hard=1024, open_now=30) == ""
    problem = fd_limit.spawn_problem("hub", existing=200, new=56, soft=1024, hard=1024, open_now=30)
    assert problem.startswith("hub can't hold 56 more procs under its limit of 1,024 open files "
                              "(RLIMIT_NOFILE, hard limit 1,024): 256 procs need about 1,088 there"), problem
    assert "room is left for 40 more" in problem and "ulimit -Hn" in problem
    # What is open counts too (e.g. many clients' connections).
    assert "hub can't hold 10 more" in fd_limit.spawn_problem("hub", existing=0, new=10, soft=1024, hard=4096,
                                                            open_now=1000)
    assert fd_limit.spawn_problem("hub", existing=10**6, new=1, soft=resource.RLIM_INFINITY,
                                  hard=resource.RLIM_INFINITY) == ""


def test_raise_soft_limit_goes_up_to_the_hard_limit_and_never_down():
    script = "from monarch_nb import fd_limit; print(*fd_limit.raise_soft_limit())"

    def run(soft: int, hard: int) -> str:
        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                              preexec_fn=limit, check=True).stdout.split()

    assert run(64, 2048) == ["2048", "2048"]
    assert run(2048, 2048) == ["2048", "2048"]


def test_a_process_holds_more_zmq_sockets_than_libzmqs_default_when_its_file_limit_allows():
    # A client holds a socket per actor it calls: with libzmq's default of 1,023 per context
    # its 1,024th ("Too many open files") failed a spawn, whatever the file limit.
    script = textwrap.dedent("""
        import zmq, zmq.asyncio
        from monarch_nb import fd_limit
        from monarch_nb.wire import sockets
        zmq.Context.instance()  # pyzmq's own, made first (by a library, say): not the one used
        contexts = (sockets.context(), sockets.sized(zmq.asyncio.Context()))
        fd_limit.raise_soft_limit()  # after: as where a client's context was made first
        held = []
        for ctx in contexts:
            made = []
            try:
                while len(made) < 1100:
                    made.append(ctx.socket(zmq.PUSH))
                    made[-1].connect("tcp://127.0.0.1:9")
            except zmq.ZMQError as e:
                print("refused", len(made), e)
            held.append(len(made))
            for sock in made:
                sock.close(0)
        print(*held)
    """)

    def run(soft: int, hard: int) -> str:
        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                              preexec_fn=limit, check=True).stdout.strip().splitlines()[-1]

    assert run(1024, 8192) == "1100 1100"


def test_a_client_holding_over_1024_open_files_starts_a_cluster():
    # (Its wait for the hub's "ready" used select(), which can't watch a descriptor past 1,023.)
    script = textwrap.dedent("""
        import os
        from monarch_nb import fd_limit
        from monarch_nb.client.cluster import Cluster
        fd_limit.raise_soft_limit()
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
        cluster = Cluster.start_ephemeral(hosts=1)
        try:
            print("health", cluster.health()["summary"], "path", cluster.path)
        finally:
            cluster.stop()
    """)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 4096))

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=TESTS,
                         preexec_fn=limit)
    assert out.returncode == 0 and "health" in out.stdout, out.stdout + out.stderr
    path = out.stdout.split("path ")[1].strip()
    assert wait_until(lambda: not cluster_processes(path), 30), cluster_processes(path)
