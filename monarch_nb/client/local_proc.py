"""``this_proc()``: the current process as a one-proc mesh, for local actors.

Actors spawned on it run in threads of this process, with the same message loop
and wire protocol as in a proc (signed with a key private to this process).
"""

from __future__ import annotations

import os
import secrets
import threading

from ..errors import HubTimeout
from ..mesh import Extent, Shape
from ..proc.server import ProcServer
from ..wire import frames as wire_frames
from ..wire.mailbox import local_mailbox
from .proc_mesh import ProcMesh

_local: "LocalProcMesh | None" = None
_lock = threading.Lock()


_LOCAL_PREFIX = "local-"  # the cluster id of this_proc(): no hub, no cluster directory


def is_this_proc(cluster_id: str) -> bool:
    """True for handles of this_proc() meshes (and their actors)."""
    return cluster_id.startswith(_LOCAL_PREFIX)


class LocalProcMesh(ProcMesh):
    """This process as a proc mesh of extent ``{}`` (one proc)."""

    def __init__(self):
        cluster_id = f"{_LOCAL_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        wire_frames.register_key(cluster_id, secrets.token_bytes(32))
        self._server = ProcServer(cluster_id, "local", has_hub=False)
        threading.Thread(target=self._server.serve, name="monarch-nb-local-proc", daemon=True).start()
        super().__init__(cluster_id, self._server.address, "local", Shape(Extent({})),
                         [{"proc_id": "local", "address": self._server.address, "pid": os.getpid(),
                           "host_id": "local"}])

    def __reduce__(self):
        raise TypeError("this_proc() of a client can't be sent to other processes")

    def _spawn_request(self, name, class_name, endpoints, methods, body, buffers, replace, main_thread,
                       timeout, while_waiting) -> dict:
        header = {"op": "spawn_actor", "mesh": name, "rank": 0, "extent": {}}
        reply = local_mailbox().request(self._server.address, self._cluster_id, header, body, buffers,
                                        timeout=timeout, check=while_waiting)
        if reply is None:
            raise HubTimeout(f"{name}: this_proc() did not construct the actor within {timeout} s")
        if not reply.header["ok"]:
            return {"failures": {0: bytes(reply.body)}}
        return {"extent": {}, "addresses": [reply.header["address"]]}

    def stop(self) -> None:
        raise TypeError("this_proc() is the client process itself; stop its actor meshes instead")


def this_proc() -> ProcMesh:
    """The current process as a proc mesh (extent ``{}``); ``this_proc().spawn(...)``
    creates actors that run in threads of this process."""
    global _local
    with _lock:
        if _local is None or _local._procs[0]["pid"] != os.getpid():
            _local = LocalProcMesh()
        return _local
