"""A connected client tells its hub it is there, so the hub can count clients and
stop a retained cluster after an idle timeout."""

from __future__ import annotations

import os
import secrets
import socket
import sys
import threading

from ..wire import frames as wire_frames
from ..wire.mailbox import local_mailbox

HEARTBEAT_S = 1.0  # the hub forgets a client silent for 3 s (hub.server.CLIENT_TIMEOUT_S)


def _label() -> str:
    if "ipykernel" in sys.modules:
        return "kernel"
    script = sys.argv[0] if sys.argv else ""
    return os.path.basename(script) if script not in ("", "-", "-c") else "python"


class Presence:
    """Sends ``client_alive`` to the hub every ``HEARTBEAT_S`` seconds from a daemon
    thread until :meth:`close`, which says goodbye."""

    def __init__(self, cluster_id: str, hub_address: str):
        self.cluster_id = cluster_id
        self.hub_address = hub_address
        self.client_id = secrets.token_hex(8)
        self._closed = threading.Event()
        self._hello = {"op": "client_alive", "client_id": self.client_id, "pid": os.getpid(),
                       "hostname": socket.gethostname(), "label": _label()}
        self._send(self._hello)
        threading.Thread(target=self._run, name="monarch-nb-presence", daemon=True).start()

    def _send(self, header: dict) -> None:
        local_mailbox().send(self.hub_address, wire_frames.encode(self.cluster_id, header))

    def _run(self) -> None:
        while not self._closed.wait(HEARTBEAT_S):
            self._send(self._hello)

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._send({"op": "client_bye", "client_id": self.client_id})
