"""A connected client tells its hub it is there (and where to send the lines its calls
cause), so the hub can count clients and stop a retained cluster after an idle timeout."""

from __future__ import annotations

import os
import socket
import sys
import threading
import traceback
from typing import Callable

from ..errors import ClusterError
from ..protocol import envelope, hub_ops
from ..wire import frames as wire_frames
from ..proc.actor import proc_identity
from .runtime import runtime

HEARTBEAT_S = 1.0  # the hub forgets a client silent for 3 s (hub.server.CLIENT_TIMEOUT_S)


def _label() -> str:
    in_proc = proc_identity()
    if in_proc is not None:
        return f"proc {in_proc['proc_id']}"
    if "ipykernel" in sys.modules:
        return "kernel"
    script = sys.argv[0] if sys.argv else ""
    return os.path.basename(script) if script not in ("", "-", "-c") else "python"


class Presence:
    """Sends ``client_alive`` to the hub every ``HEARTBEAT_S`` seconds from a daemon
    thread until :meth:`close`, which says goodbye. ``watch`` (optional) runs on that
    thread after each heartbeat (the cluster watching its hub)."""

    def __init__(self, cluster_id: str, hub_address: str, watch: Callable[[], None] | None = None):
        self.cluster_id = cluster_id
        self.hub_address = hub_address
        self._watch = watch
        self._closed = threading.Event()
        rt = runtime()
        self._hello = {envelope.OP: hub_ops.CLIENT_ALIVE, "client_id": rt.client_id, "pid": os.getpid(),
                       "hostname": socket.gethostname(), "label": _label(), "logs": rt.event_inbox().address,
                       # A proc's own output is captured already: forwarding lines to it would echo.
                       "lines": proc_identity() is None}
        self._send(self._hello)
        threading.Thread(target=self._run, name="monarch-nb-presence", daemon=True).start()

    def _send(self, header: dict) -> None:
        runtime().mailbox.send(self.hub_address, wire_frames.encode(self.cluster_id, header))

    def _try_send(self, header: dict) -> None:
        """:meth:`_send`, for the heartbeat and goodbye: a hub that is gone refuses them
        (``ClusterError``, e.g. another cluster's process on its port now), which must not
        end the heartbeat thread: its watch below finds out what became of the hub."""
        try:
            self._send(header)
        except ClusterError:
            pass

    def _run(self) -> None:
        told = False
        while not self._closed.wait(HEARTBEAT_S):
            self._try_send(self._hello)
            if self._watch is not None:
                try:
                    self._watch()
                except Exception:  # noqa: BLE001 - a failing check must not end the heartbeat
                    if not told:  # once: it would fail every second
                        told = True
                        traceback.print_exc()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._try_send({envelope.OP: hub_ops.CLIENT_BYE, "client_id": runtime().client_id})


def join_hub(cluster_id: str, hub_address: str) -> Presence:
    """This process's presence as a client of the hub of ``cluster_id``, made once (and
    again after it was closed). For procs: an actor calling a mesh it was handed (an
    argument), never having called ``this_host()``, was no client of its hub, heard of
    no death, and its call on an actor whose proc died waited for good; the hub tells
    its clients which actors died (``actors_gone``), and calls to them fail at once."""
    rt = runtime()
    with rt.presences_lock:
        presence = rt.presences.get(cluster_id)
        if presence is None or presence.closed:
            presence = rt.presences[cluster_id] = Presence(cluster_id, hub_address)
        return presence
