"""``this_proc()``: the current process as a one-proc mesh, for local actors.

Actors spawned on it run in threads of this process, with the same message loop
and wire protocol as in a proc (signed with a key private to this process). There is
no hub: :class:`LocalControl` is its control plane, served in this process.
"""

from __future__ import annotations

import os
import secrets
import threading
import time

from ..errors import HubTimeout, InvalidRequest, actor_gone_report, actor_name
from ..mesh import Extent, Shape
from ..proc.server import ProcServer
from ..protocol import envelope, events, hub_ops, proc_ops
from ..protocol.states import FailureKind
from ..wire import frames as wire_frames
from .control import ControlPlane
from .mesh_handle import LOCAL_PREFIX
from .proc_mesh import ProcMesh
from .runtime import runtime

_NO_HUB = ("this_proc() meshes run in threads of this client process, which has no hub to {what}; "
           "{instead}, or run the actors on procs of a cluster: this_host().spawn_procs()")


class LocalControl(ControlPlane):
    """The control plane of ``this_proc()``: requests go to the in-process proc server;
    ops that need a hub (restart, the registry, the debugger's list) raise
    :class:`InvalidRequest` at once."""

    def __init__(self, cluster_id: str, server: ProcServer):
        self.cluster_id = cluster_id
        self.server = server

    def _request(self, header: dict, body=None, buffers=(), timeout=None, check=None):
        return runtime().mailbox.request(self.server.address, self.cluster_id, header, body, buffers,
                                         timeout=timeout, check=check)

    def spawn_actors(self, proc_mesh, proc_ranks, name, fields, body, buffers, timeout, while_waiting) -> dict:
        fault = not fields.get(hub_ops.RAISE_INIT_ERRORS, False)
        header = {envelope.OP: proc_ops.SPAWN_ACTOR, proc_ops.MESH: name, envelope.RANK: 0, proc_ops.EXTENT: {},
                  proc_ops.INIT_FAULT: fault}
        reply = self._request(header, body, buffers, timeout=timeout, check=while_waiting)
        if reply is None:
            raise HubTimeout(f"{name}: this_proc() did not construct the actor within {timeout} s")
        if reply.header[envelope.OK]:
            return {"name": name, "extent": {}, "addresses": [reply.header[proc_ops.ADDRESS]], "dead": {}}
        if not fault:
            return {"failures": {0: bytes(reply.body)}}
        # No hub to supervise: the failure goes straight to this client's hooks, as the
        # hub's would (the actor answers calls with it).
        why = f"{name} rank 0: __init__ raised {reply.header.get(envelope.ERROR, '')}"
        report = actor_gone_report(actor_name(fields["class_name"], name, {}, 0), why)
        runtime().supervision.on_event({envelope.OP: events.SUPERVISION, events.CLUSTER: self.cluster_id, "failure": {
            "kind": FailureKind.ACTOR_FAILED, "proc_mesh": "this_proc", "meshes": [name], "ranks": [0], "why": why,
            "endpoint": "__init__", "traceback": reply.header.get(proc_ops.TRACEBACK, ""), "report": report}})
        return {"name": name, "extent": {}, "addresses": [reply.header[proc_ops.ADDRESS]], "dead": {"0": report}}

    def stop_actors(self, proc_mesh: str, name: str, timeout: float | None = None) -> list[dict]:
        reply = self._request({envelope.OP: proc_ops.STOP_ACTOR, proc_ops.MESH: name}, timeout=timeout)
        if reply is None or reply.header.get("stopped") is not False:
            return []
        return [{"rank": 0, "running": reply.header.get("running")}]

    def stop_procs(self, name: str) -> None:
        raise InvalidRequest(_NO_HUB.format(what="stop", instead="stop its actor meshes (mesh.stop()) instead"))

    def restart_procs(self, proc_mesh, proc_ranks, timeout) -> dict:
        raise InvalidRequest(_NO_HUB.format(
            what="restart it", instead="stop the actor mesh (mesh.stop()) and spawn it again"))

    def proc_mesh_record(self, name: str) -> dict | None:
        return {"procs": [self.server_record()]}

    def actor_mesh_record(self, proc_mesh: str, name: str) -> dict | None:
        raise InvalidRequest(_NO_HUB.format(
            what="restart it", instead="stop the actor mesh (mesh.stop()) and spawn it again"))

    def interrupt(self, procs: list[dict], timeout: float) -> None:
        # In process, and only the actors' threads: a SIGINT would land in the client itself.
        targets = [(a, a.calls) for a in list(self.server.actors.values()) if a.busy]
        if targets:
            threading.Thread(target=ProcServer._interrupt_threads, args=(targets,), daemon=True,
                             name="monarch-nb-interrupt").start()

    def interrupt_calls(self, meshes: list[tuple[str, str, dict[int, list[tuple[str, int]]]]],
                        timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        unconfirmed = []
        for _, name, routes in meshes:  # one proc, this one: each answers at once
            header = {envelope.OP: proc_ops.INTERRUPT, proc_ops.MESH: name, proc_ops.ROUTES: routes.get(0, [])}
            left = max(deadline - time.monotonic(), 0.0)
            unconfirmed.append(0 if self._request(header, timeout=left) is not None else 1)
        return unconfirmed

    def paused(self, timeout: float) -> list[dict]:
        return []  # no debug registry without a hub

    def set_rank_env(self, proc_mesh: str, env: dict[int, dict]) -> None:
        pass  # nothing restarts this proc: nothing to remember

    def machines(self, host_ids: set[str]) -> int:
        return 1  # this process's

    def server_record(self) -> dict:
        return {"proc_id": "local", "address": self.server.address, "pid": os.getpid(), "host_id": "local",
                "exit_code": None}


class LocalProcMesh(ProcMesh):
    """This process as a proc mesh of extent ``{}`` (one proc)."""

    def __init__(self):
        cluster_id = f"{LOCAL_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        wire_frames.register_key(cluster_id, secrets.token_bytes(32))
        server = ProcServer(cluster_id, "local", has_hub=False)
        threading.Thread(target=server.serve, name="monarch-nb-local-proc", daemon=True).start()
        control = LocalControl(cluster_id, server)
        runtime().local_planes[cluster_id] = control
        record = control.server_record()
        del record["exit_code"]
        super().__init__(cluster_id, server.address, "local", Shape(Extent({})), [record])

    def __reduce__(self):
        raise TypeError("this_proc() of a client can't be sent to other processes")


_local: LocalProcMesh | None = None
_lock = threading.Lock()


def this_proc() -> ProcMesh:
    """The current process as a proc mesh (extent ``{}``); ``this_proc().spawn(...)``
    creates actors that run in threads of this process."""
    global _local
    with _lock:
        if _local is None or _local._procs[0]["pid"] != os.getpid():
            _local = LocalProcMesh()
        return _local
