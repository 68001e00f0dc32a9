"""Workers started before any cluster (``run_worker_loop_forever``) and a client that
attaches to them (``attach_to_workers``), as Monarch runs on machines it did not start:
each worker becomes the cluster's host agent, and ends with the cluster."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from conftest import wait_until
from monarch_nb.actor import Actor, ClusterError, attach_to_workers, current_rank, endpoint, run_worker_loop_forever


class Where(Actor):
    @endpoint
    def where(self) -> tuple[int, int]:
        import psutil

        parent = psutil.Process(os.getppid())
        if parent.cmdline()[1:3] == ["-m", "monarch_nb.host.forkserver"]:  # (forked by its host's forkserver)
            parent = parent.parent()
        return current_rank().rank, parent.pid  # the proc's host agent: the worker


def _worker(address: str, **popen) -> subprocess.Popen:
    code = ("from monarch_nb.actor import run_worker_loop_forever; "
            f"run_worker_loop_forever(address={address!r}, ca='trust_all_connections')")
    return subprocess.Popen([sys.executable, "-c", code], **popen)


@pytest.fixture
def workers(tmp_path):
    """Two workers, on an ipc path and on a TCP socket handed over as a descriptor;
    yields their processes and the addresses to attach to."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    procs = [_worker(f"ipc://{tmp_path}/w0"),
             _worker(f"tcp://127.0.0.1:fd{listening.fileno()}", pass_fds=(listening.fileno(),))]
    listening.close()
    yield procs, [f"ipc://{tmp_path}/w0", f"tcp://127.0.0.1:{port}"]
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_attached_workers_become_the_hosts_and_end_at_shutdown(workers):
    procs, addresses = workers
    hosts = attach_to_workers(workers=addresses, ca="trust_all_connections")
    assert dict(hosts.extent) == {"hosts": 2}
    placed = hosts.spawn_procs(per_host={"gpus": 1}).spawn("where", Where).where.call().get().values()
    assert placed == [(0, procs[0].pid), (1, procs[1].pid)]  # host i is worker i
    hosts.shutdown().get()
    assert wait_until(lambda: all(p.poll() is not None for p in procs), 20)


def test_attach_fails_naming_a_worker_that_does_not_answer(tmp_path, capfd):
    with pytest.raises(ClusterError, match="could not start"):
        attach_to_workers(workers=[f"ipc://{tmp_path}/nobody"], ca="trust_all_connections")
    assert "nobody did not answer" in capfd.readouterr().err  # the hub's reason, shown as it gave up


def test_workers_refuse_any_ca_but_trust_all():
    with pytest.raises(NotImplementedError, match="trust_all_connections"):
        run_worker_loop_forever(address="ipc:///tmp/unused", ca="/path/to/ca.pem")
    with pytest.raises(NotImplementedError, match="trust_all_connections"):
        attach_to_workers(workers=["ipc:///tmp/unused"], ca="/path/to/ca.pem")


def test_a_waiting_worker_closes_a_request_over_its_limit_unread_and_serves_on(tmp_path):
    import json

    import zmq

    from monarch_nb.host.worker import MAX_REQUEST_BYTES

    address = f"ipc://{tmp_path}/w"
    worker = _worker(address)
    ctx = zmq.Context()
    try:
        big = ctx.socket(zmq.REQ)
        monitor = big.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        big.connect(address)
        big.send(b" " * (MAX_REQUEST_BYTES + 1))  # a worker holds no key: anyone may send
        assert monitor.poll(30_000), "the worker kept the connection of an oversized request"
        big.disable_monitor()
        monitor.close(0)
        big.close(0)
        small = ctx.socket(zmq.REQ)
        small.connect(address)
        small.send(json.dumps({"not": "a request"}).encode())
        assert small.poll(30_000), "the worker stopped answering"
        assert "needs strings" in json.loads(small.recv())["error"]
        small.close(0)
        assert worker.poll() is None
    finally:
        ctx.destroy(0)
        worker.kill()
        worker.wait()
