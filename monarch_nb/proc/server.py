"""A proc's control loop: spawns and stops actors on the hub's orders.

Control messages (from the hub) arrive on the proc's own inbox; endpoint calls never
pass through here: each actor has its own socket (see ``actor_loop``).
"""

from __future__ import annotations

import os

from ..mesh import Extent
from ..wire import frames as wire_frames
from ..wire import sockets
from .actor_loop import ActorThread, send_reply


class ProcServer:
    """Serves one proc's control inbox until told to exit."""

    def __init__(self, cluster_id: str, proc_id: str):
        self.cluster_id = cluster_id
        self.proc_id = proc_id
        self.outbox = sockets.Outbox()
        self.inbox, self.address = sockets.bind_inbox()
        self.actors: dict[str, ActorThread] = {}

    def interrupt(self) -> list[str]:
        """KeyboardInterrupt into every actor busy with a message; returns their meshes."""
        return [name for name, actor in list(self.actors.items()) if actor.interrupt()]

    def serve(self) -> None:
        while True:
            try:
                message = wire_frames.decode(sockets.recv_frames(self.inbox))
            except wire_frames.BadMessage:
                continue
            if self.handle(message) == "exit":
                return

    def _reply(self, header: dict, value=None, **extra) -> None:
        send_reply(self.outbox, self.cluster_id, (header["reply"], header["port"]),
                   header.get("rank", 0), value=value, extra=extra)

    def handle(self, message: wire_frames.Message) -> str | None:
        header = message.header
        op = header["op"]
        if op == "spawn_actor":
            extent = Extent(header["extent"])
            point = extent.point(header["rank"])
            actor = ActorThread(self.cluster_id, header["mesh"], point, self.proc_id, message,
                                (header["reply"], header["port"]), self.outbox)
            self.actors[header["mesh"]] = actor
            actor.start()  # the actor thread replies once constructed
        elif op in ("stop_actor", "stop_actors"):  # stop_actors: this_proc() acting as its own hub
            actor = self.actors.pop(header.get("mesh") or header.get("name"), None)
            if actor is not None and actor.address is not None and actor.thread.is_alive():
                # Queued behind whatever the actor is doing: it stops after that.
                self.outbox.send(actor.address, wire_frames.encode(self.cluster_id, {"k": "stop"}))
            self._reply(header)
        elif op == "interrupt":
            self.interrupt()
            self._reply(header)
        elif op == "ping":
            self._reply(header, {"pid": os.getpid(), "actors": sorted(self.actors)})
        elif op == "exit":
            return "exit"
        return None
