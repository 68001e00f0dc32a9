"""this_proc(): the client process as a mesh, with its own control plane (no hub)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from monarch_nb.actor import Actor, ActorError, InvalidRequest, endpoint, this_proc


class Napper(Actor):
    @endpoint
    def nap(self, seconds: float) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.01)
        return "rested"

    @endpoint
    def ping(self) -> int:
        return os.getpid()


def test_restart_of_a_this_proc_mesh_fails_at_once_with_what_to_do():
    mesh = this_proc().spawn("local_restart", Napper)
    try:
        started = time.monotonic()
        with pytest.raises(InvalidRequest, match="can't|stop the actor mesh"):
            mesh.restart()
        with pytest.raises(InvalidRequest):
            this_proc().restart_failed()
        assert time.monotonic() - started < 1.0
    finally:
        mesh.stop()


def test_interrupt_of_a_this_proc_actor_spares_the_client():
    mesh = this_proc().spawn("local_interrupt", Napper)
    try:
        call = mesh.nap.call_one(30.0)
        time.sleep(0.3)  # let the endpoint start
        this_proc().interrupt()  # a SIGINT would raise KeyboardInterrupt here, in the client
        with pytest.raises(ActorError, match="KeyboardInterrupt"):
            call.get(timeout=10)
        assert mesh.ping.call_one().get(timeout=10) == os.getpid()  # the client and the actor carry on
    finally:
        mesh.stop()


def test_interrupting_a_cells_calls_on_this_proc_stops_them_and_refuses_the_queued_one():
    # What Ctrl-C in a notebook does to the cell's calls (``client.in_flight``).
    from monarch_nb.client import in_flight
    from monarch_nb.client.runtime import runtime

    mesh = this_proc().spawn("local_cell_calls", Napper)
    rt = runtime()
    rt.cell, before = "a-cell", rt.cell
    try:
        running, queued = mesh.nap.call_one(30.0), mesh.nap.call_one(30.0)
        assert in_flight.interrupt(rt.in_flight.of_cell("a-cell")) == ["local_cell_calls.nap (ranks 0)"]
        for call in (running, queued):
            with pytest.raises(ActorError, match="KeyboardInterrupt"):
                call.get(timeout=10)
        assert rt.in_flight.of_cell("a-cell") == []
        assert mesh.ping.call_one().get(timeout=10) == os.getpid()  # the client and the actor carry on
    finally:
        rt.cell = before
        mesh.stop()


def test_a_cluster_displays_without_ipywidgets():
    code = textwrap.dedent("""
        import sys
        sys.modules["ipywidgets"] = None  # unimportable
        import monarch_nb.actor
        from monarch_nb.actor import this_host
        from monarch_nb.client.cluster import default_cluster
        this_host()
        cluster = default_cluster()
        assert "Cluster" in repr(cluster)
        bundle = cluster._repr_mimebundle_()
        assert "text/html" in bundle and "text/plain" in bundle, bundle
        print("displayed")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "displayed" in out.stdout


def test_every_value_a_local_actor_sent_through_a_port_before_returning_arrives():
    # A client that attached to another cluster first (as a notebook does before its
    # first this_proc()) signed its ports' values for that cluster and the local actor's
    # replies for its own: the socket they share was closed at each switch of
    # credentials, with the values it still held (lost on a loaded machine; CI).
    code = textwrap.dedent("""
        import secrets
        from monarch_nb.wire import frames as wire_frames
        wire_frames.register_key("attached-first", secrets.token_bytes(32))
        from monarch_nb.actor import Actor, Channel, endpoint, this_proc

        class Sender(Actor):
            @endpoint
            def send(self, port, n: int) -> int:
                for i in range(n):
                    port.send(i)
                return n

        mesh = this_proc().spawn("local_sender", Sender)
        port, receiver = Channel.open()
        for _ in range(5):
            assert mesh.send.call_one(port, 5000).get(timeout=60) == 5000
            assert [receiver.recv().get(timeout=30) for _ in range(5000)] == list(range(5000))
        mesh.stop()
        print("all arrived")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "all arrived" in out.stdout
