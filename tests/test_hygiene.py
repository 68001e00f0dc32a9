"""Process hygiene: an ephemeral cluster's processes all end with the script that made
it, however the script ends, and with its hub."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

import monarch_nb

from conftest import cluster_processes, pids_alive, wait_until

SCRIPT = textwrap.dedent("""
    import json, sys, time
    from monarch_nb.actor import Actor, endpoint, this_host
    from monarch_nb.client import cluster as cluster_mod
    from monarch_nb.client.runtime import runtime

    class Echo(Actor):
        @endpoint
        def echo(self, x):
            return x

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("echo", Echo)
    assert mesh.echo.call("hi").get().values() == ["hi", "hi"]
    c = runtime().cluster
    print(json.dumps({"path": str(c.path), "hub": c._hub_process.pid, "procs": procs.pids}), flush=True)
    mode = sys.argv[1]
    if mode == "raise":
        raise RuntimeError("script failed")
    if mode == "wait":
        print("waiting", flush=True)
        time.sleep(600)
""")


def _start(mode: str):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    info = json.loads(proc.stdout.readline())
    return proc, info


def _assert_all_gone(info):
    pids = [info["hub"], *info["procs"]]
    assert wait_until(lambda: not pids_alive(pids) and not cluster_processes(info["path"]), 10), (
        f"left behind: {cluster_processes(info['path'])}")
    assert wait_until(lambda: not os.path.exists(info["path"]), 5)


@pytest.mark.parametrize("mode", ["exit", "raise"])
def test_cluster_ends_when_script_ends(mode):
    proc, info = _start(mode)
    proc.communicate(timeout=60)
    assert proc.returncode == (0 if mode == "exit" else 1)
    _assert_all_gone(info)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_cluster_ends_when_script_is_signalled(sig):
    proc, info = _start("wait")
    assert proc.stdout.readline().strip() == "waiting"
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    _assert_all_gone(info)


def test_host_agent_and_procs_stop_after_grace_when_hub_is_killed():
    proc, info = _start("wait")
    assert proc.stdout.readline().strip() == "waiting"
    agents = [p.pid for p in psutil.Process(info["hub"]).children()]
    os.kill(info["hub"], signal.SIGKILL)
    # Ephemeral clusters give host agents a 2 s grace period before they stop everything.
    assert wait_until(lambda: not pids_alive(agents + info["procs"]), 10)
    proc.kill()
    proc.communicate(timeout=30)
    # Its directory is left (the hub was killed); listing clusters tidies it away.
    assert os.path.isdir(info["path"])
    assert info["path"] not in [c["path"] for c in monarch_nb.list_clusters()]
    assert not os.path.exists(info["path"])
