"""Shared fixtures: an isolated MONARCH_NB_HOME, one ephemeral cluster per test module,
and a check that every process a test started is gone afterwards."""

from __future__ import annotations

import atexit
import faulthandler
import os
import shutil
import signal
import sys
import tempfile
import time

import psutil
import pytest

HOME_PREFIX = "monarch-nb-test-"
# Before anything starts a cluster: never touch the user's real cluster directory. A
# proc that imports a test module (to unpickle its actor class) imports this too, with
# the run's home already set: it keeps it (a folder of its own would be left behind,
# since procs end without exit handlers).
if not os.path.basename(os.environ.get("MONARCH_NB_HOME", "")).startswith(HOME_PREFIX):
    os.environ["MONARCH_NB_HOME"] = tempfile.mkdtemp(prefix=HOME_PREFIX)
    # Leave no folder in /tmp. Registered before monarch_nb is imported, so it runs after
    # monarch_nb's own exit handlers have torn down this process's ephemeral clusters.
    atexit.register(shutil.rmtree, os.environ["MONARCH_NB_HOME"], ignore_errors=True)

# A suite started from a background job (`cmd &` in a script) inherits SIGINT ignored, and
# so would every process a test starts: Ctrl-C tests would find nothing to interrupt.
# A handler here is reset to the default in each child at exec, where Python installs its own.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Seconds the test process may take to exit once pytest is done (exit handlers stop the
# clusters tests left to them, then the interpreter ends).
EXIT_TIMEOUT_S = 120


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    # A process that does not exit is a bug a user's script would hit too: make it a
    # failure that shows every thread's stack, not a silent hang until CI's time is up.
    faulthandler.dump_traceback_later(EXIT_TIMEOUT_S, exit=True, file=sys.__stderr__)


def cluster_processes(path) -> list[psutil.Process]:
    """Live processes (hub, host agents, procs) started for the cluster at ``path``."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and str(path) in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


REQUIRE_SYSTEM_ENV = "MONARCH_NB_REQUIRE_SYSTEM"  # "1" (set by .ci/run): missing system parts fail


def system_part_missing(why: str) -> None:
    """A test's system part (Slurm, network namespaces, a browser) is missing here: skip
    the test saying ``why``, or fail it where ``MONARCH_NB_REQUIRE_SYSTEM=1`` makes
    them required (CI sets them up, so there a missing one is a failure)."""
    if os.environ.get(REQUIRE_SYSTEM_ENV) == "1":
        pytest.fail(f"{why} ({REQUIRE_SYSTEM_ENV}=1 requires it)", pytrace=False)
    pytest.skip(why)


def wait_until(condition, timeout: float, interval: float = 0.02):
    """Poll ``condition`` until it returns a truthy value or ``timeout`` seconds pass;
    returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def cuda_gpu_count() -> int:
    """How many CUDA GPUs torch sees here (0 without torch or CUDA). torch is imported
    only when called: procs import the test modules for their actor classes."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pid_gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie, or reaped: also between looking and reading)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except OSError:  # FileNotFoundError, or ProcessLookupError while it is being reaped
        return True


def pids_alive(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture(scope="module")
def cluster():
    from monarch_nb.client.cluster import Cluster

    c = Cluster.start_ephemeral()
    yield c
    c.stop()
    assert wait_until(lambda: not cluster_processes(c.path), 10), (
        f"processes left behind: {cluster_processes(c.path)}")
    assert not c.path.exists(), "ephemeral cluster directory left behind"


@pytest.fixture(scope="module")
def host(cluster):
    return cluster.this_host()  # one host, no dimensions: what this_host() gives


@pytest.fixture(scope="module")
def procs4(host):
    procs = host.spawn_procs(per_host={"gpus": 4}, name="procs4")
    yield procs
    procs.stop()


@pytest.fixture
def faults():
    """Failures that reached ``monarch_nb.actor.unhandled_fault_hook`` during the test
    (Monarch's way of replacing it: assigning the module attribute)."""
    import monarch_nb.actor

    seen: list = []
    default = monarch_nb.actor.unhandled_fault_hook
    monarch_nb.actor.unhandled_fault_hook = seen.append
    yield seen
    monarch_nb.actor.unhandled_fault_hook = default
