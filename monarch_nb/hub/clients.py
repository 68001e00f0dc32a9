"""The clients connected to the hub: who they are, where they want events, and when
the last one left (the idle timeout of a retained cluster counts from then).

A client says it is alive every second (``client_alive``) and goodbye when it
disconnects (``client_bye``); one silent for ``CLIENT_TIMEOUT_S``, or whose process on
this machine has exited, is forgotten (see ``heartbeats``).
"""

from __future__ import annotations

import socket
import time
from typing import Awaitable, Callable

import psutil

from ..wire.aio import AioEndpoint
from .records import ClientRecord

CLIENT_TIMEOUT_S = 3.0  # a client silent this long is no longer counted as connected


def _client_alive(client: ClientRecord) -> bool:
    """False once a client on this machine has exited (a kernel restart): it is then
    forgotten at once instead of after ``CLIENT_TIMEOUT_S``."""
    if client.hostname != socket.gethostname():
        return True
    try:
        return psutil.Process(client.pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Clients:
    """The table of connected clients (client id -> record)."""

    def __init__(self, net: AioEndpoint):
        self._net = net
        self.table: dict[str, ClientRecord] = {}
        self.idle_since = time.monotonic()  # when the last client left (meaningful while there is none)
        # Awaited with each client that joins (or joins again after it was forgotten).
        self.on_joined: Callable[[ClientRecord], Awaitable[None]] | None = None

    async def client_alive(self, header, message):
        client = self.table.get(header["client_id"])
        if client is None:
            client = self.table[header["client_id"]] = ClientRecord(
                header["client_id"], header["pid"], header["hostname"], header["label"], header.get("logs"),
                wants_lines=header.get("lines", True))
            if self.on_joined is not None:
                await self.on_joined(client)
        client.last_seen = time.monotonic()

    async def client_bye(self, header, message):
        client = self.table.pop(header["client_id"], None)
        if client is not None:
            self._forget(client, time.monotonic())

    def expire(self, heard_up_to: float) -> None:
        """Forget the clients not heard from for ``CLIENT_TIMEOUT_S`` before
        ``heard_up_to`` (when this hub last caught up with its inbox), and those whose
        process has exited."""
        for client_id, client in list(self.table.items()):
            if heard_up_to - client.last_seen > CLIENT_TIMEOUT_S or not _client_alive(client):
                del self.table[client_id]
                self._forget(client, client.last_seen)

    def heard_at(self, now: float) -> None:
        """This hub was deaf until ``now`` (stalled): no client's silence, nor the idle
        time, is counted before it."""
        for client in self.table.values():
            client.last_seen = max(client.last_seen, now)
        if not self.table:
            self.idle_since = max(self.idle_since, now)

    def opened(self, now: float) -> None:
        """This hub is ready for clients at ``now``: idle time counts from then, after a
        ``CLIENT_TIMEOUT_S`` window in which the client that started it says hello (on a
        loaded machine that first hello may come seconds later)."""
        if not self.table:
            self.idle_since = now + CLIENT_TIMEOUT_S

    def idle_for(self, now: float) -> float:
        """Seconds without any connected client at ``now`` (0 while one is connected)."""
        return 0.0 if self.table else max(0.0, now - self.idle_since)

    def _forget(self, client: ClientRecord, last_seen: float) -> None:
        if client.log_address:
            self._net.forget(client.log_address)
        if not self.table:
            self.idle_since = last_seen
