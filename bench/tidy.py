"""What the benchmarks share: an isolated MONARCH_NB_HOME, the leftover check, and the
start of the raw servers their floors are measured against."""

from __future__ import annotations

import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Callable

import psutil
import zmq

# The start of a raw pyzmq + cloudpickle server for a benchmark's floor (run with
# ``python -c``): it exits when the benchmark does, binds a ROUTER on loopback and prints
# its port; the rest of the script is its receive loop.
# The start of any helper process a benchmark runs with ``python -c``: it exits when the
# benchmark does, however the benchmark ends.
WATCH_PARENT = r"""
import os, sys, threading, time
parent = os.getppid()
def watch():  # never outlive the benchmark
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(1)
threading.Thread(target=watch, daemon=True).start()
"""

RAW_SERVER_PRELUDE = WATCH_PARENT + r"""
import zmq, cloudpickle
ctx = zmq.Context()
sock = ctx.socket(zmq.ROUTER)
sock.setsockopt(zmq.LINGER, 0)
port = sock.bind_to_random_port("tcp://127.0.0.1")
sys.stdout.write(f"{port}\n"); sys.stdout.flush()
"""


def isolated_home() -> str | None:
    """Use a fresh temp MONARCH_NB_HOME unless one is set; returns it if it is ours."""
    if os.environ.get("MONARCH_NB_HOME"):
        return None
    home = os.environ["MONARCH_NB_HOME"] = tempfile.mkdtemp(prefix="monarch_nb_bench_")
    return home


def start_cluster(name: str, env: dict[str, str], **options):
    """``monarch_nb.Cluster.start(name, **options)`` with ``env`` added to the environment
    its hub and host agents inherit, and this process's environment as it was after."""
    import monarch_nb  # (not at import: isolated_home goes first)

    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        return monarch_nb.Cluster.start(name, **options)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value


def stop_and_check(cluster, own_home: str | None) -> int:
    """Stop ``cluster``, delete ``own_home``; prints what was left running and returns
    the exit status (1 if any process of the cluster outlived it)."""
    path = str(cluster.path)
    cluster.stop()
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if path in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE]
    if own_home:
        shutil.rmtree(own_home, ignore_errors=True)
    if left:
        print(f"processes left behind: {left}", flush=True)
        return 1
    return 0


def ms_row(name: str, seconds: list[float], width: int = 28) -> str:
    """One figure's line: ``name``, then the median of ``seconds`` (durations in
    seconds) in ms, with min and max."""
    return (f"  {name:{width}} {statistics.median(seconds) * 1e3:8.0f} ms   (min {min(seconds) * 1e3:.0f}, "
            f"max {max(seconds) * 1e3:.0f})")


def module_from_git(path: str, wanted: Callable[[str], bool], package: str | None = None):
    """The newest committed version of ``path`` (relative to the repository) whose source
    ``wanted`` accepts, loaded as a module (its relative imports resolved in ``package``):
    a baseline that a change replaced, measured in the same run. Returns (module, commit)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commits = subprocess.run(["git", "-C", repo, "log", "--format=%H", "--", path], capture_output=True,
                             text=True, check=True).stdout.split()
    for commit in commits:
        source = subprocess.run(["git", "-C", repo, "show", f"{commit}:{path}"], capture_output=True, text=True,
                                check=True).stdout
        if wanted(source):
            break
    else:
        raise RuntimeError(f"no version of {path} in git history is the baseline this benchmark wants")
    spec = importlib.util.spec_from_loader(f"baseline_{commit[:10]}", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = package
    exec(compile(source, f"{commit[:10]}:{path}", "exec"), module.__dict__)
    return module, commit[:10]


class RawClient:
    """A DEALER connected to a raw server (``code``, run with ``python -c``, starting with
    ``RAW_SERVER_PRELUDE``) in another process: the floor of a benchmark."""

    def __init__(self, code: str):
        self.server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                       stdin=subprocess.DEVNULL)
        self.pid = self.server.pid
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://127.0.0.1:{int(self.server.stdout.readline())}")

    def close(self, stop: bytes) -> None:
        """Send the server ``stop`` (its message to end) and wait for it (killed after 10 s)."""
        self.sock.send(stop)
        try:
            self.server.wait(10)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()
        self.server.stdout.close()
        self.sock.close(0)
        self.ctx.term()


def bare_interpreters(n: int) -> float:
    """Seconds for ``n`` interpreters importing what a proc imports, started in parallel
    and waited for: the floor of spawning ``n`` procs on this machine."""
    import time
    started = time.perf_counter()
    children = [subprocess.Popen([sys.executable, "-c", "import monarch_nb.proc.__main__"]) for _ in range(n)]
    for child in children:
        child.wait()
    return time.perf_counter() - started
