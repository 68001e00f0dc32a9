"""Events from the hub to every client's event inbox (see ``protocol.events``)."""

from __future__ import annotations

import asyncio
from typing import Callable

import zmq

from ..protocol import envelope, events
from ..wire.aio import AioEndpoint
from .clients import Clients
from .records import ClientRecord

EVENT_COALESCE_S = 0.1  # health_changed goes out at most this often


class Announcer:
    """Sends events, stamped with ``cluster_id``, to the clients of ``clients``."""

    def __init__(self, net: AioEndpoint, cluster_id: str, clients: Clients):
        self._net = net
        self._cluster_id = cluster_id
        self._clients = clients
        self._health_pending = False
        self.health_listeners: list[Callable[[], None]] = []  # told at once of every change (hub.health_feed)

    async def announce(self, event: dict) -> None:
        """Send ``event`` to every client's event inbox (its log receiver)."""
        for client in list(self._clients.table.values()):
            await self.tell(client, event)

    async def tell(self, client: ClientRecord, event: dict) -> None:
        """Send ``event`` to ``client``'s event inbox, if it has one."""
        if client.log_address:
            try:
                await self._net.send(client.log_address, {**event, events.CLUSTER: self._cluster_id})
            except zmq.ZMQError:  # e.g. the hub closed its sockets (stopping) while this was due:
                pass  # events are best effort (a client asks the hub for what it missed)

    def health_changed(self) -> None:
        """Announce ``health_changed`` once per ``EVENT_COALESCE_S``, however many changes."""
        for listener in self.health_listeners:
            listener()
        if self._health_pending:
            return
        self._health_pending = True

        def announce():
            self._health_pending = False
            asyncio.ensure_future(self.announce({envelope.OP: events.HEALTH_CHANGED}))

        asyncio.get_running_loop().call_later(EVENT_COALESCE_S, announce)
