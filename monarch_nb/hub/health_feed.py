"""The health tree, pushed: a client subscribes once (``health_subscribe``: the whole
tree), then receives only what changed (``health_delta`` events, ``protocol.health_tree``)
instead of asking for the whole tree again every second.

While anyone subscribes, the hub builds one tree per round, whatever the number of
subscribers, from the statuses the heartbeats brought (``hub.health``): a round runs soon
after the registry changed or an actor's activity changed (at most every
``MIN_INTERVAL_S``), and at least every ``ROUND_S`` so that a proc gone silent shows
unresponsive. Each subscriber gets the delta from the tree it holds: figures that move
on their own (memory, CPU, uptime, busy-for) at most every ``volatile_every_s`` it asked
for, states at once. A subscriber with nothing new hears an empty delta every
``KEEPALIVE_S``, so that it can tell a quiet cluster from a lost subscription (a
recovered hub knows none) and subscribe again.
"""

from __future__ import annotations

import asyncio
import pickle
import sys
import time
from dataclasses import dataclass

import zmq

from ..protocol import envelope, events, health_tree, hub_ops
from ..wire.aio import AioEndpoint
from .clients import Clients
from .health import Health

ROUND_S = 1.0  # with subscribers, a tree is built at least this often
MIN_INTERVAL_S = 0.1  # and at most this often, however many changes (a feed redraws at most 4 times a second)
KEEPALIVE_S = 5.0  # a subscriber hears at least this often, if only an empty delta
ORPHAN_S = 10.0  # a subscription whose client the hub has not known for this long is dropped
DEFAULT_VOLATILE_EVERY_S = 1.0


def _copy(value):
    """A deep copy: a subscriber's tree must share nothing with the next round's tree."""
    return pickle.loads(pickle.dumps(value, protocol=5))


@dataclass
class Subscription:
    """One feed of one client: where its deltas go, and the tree it holds (version ``seq``)."""

    sub_id: str
    client_id: str
    address: str
    volatile_every_s: float
    tree: dict
    seq: int = 0
    volatile_due: float = 0.0
    last_sent: float = 0.0
    known_at: float = 0.0  # last time its client was in the hub's table


class HealthFeed:
    """Pushes the trees of ``health`` to subscribed clients of ``clients`` through ``net``."""

    def __init__(self, health: Health, net: AioEndpoint, clients: Clients, cluster_id: str):
        self._health = health
        self._net = net
        self._clients = clients
        self._cluster_id = cluster_id
        self._subscriptions: dict[str, Subscription] = {}
        self._wake = asyncio.Event()
        self.rounds = 0  # trees built for subscribers
        self.deltas = 0  # deltas sent (empty keepalives not counted)

    def changed(self) -> None:
        """Something the tree shows changed: run a round soon (coalesced)."""
        self._wake.set()

    async def subscribe(self, header, message):
        """``health_subscribe``: the whole tree now, then deltas to the client's event
        inbox (``events.HEALTH_DELTA``) with the subscription id it chose."""
        self._health.want(3 * ROUND_S)
        tree = await self._health.build()
        now = time.monotonic()
        every = float(header.get(hub_ops.VOLATILE_EVERY_S) or DEFAULT_VOLATILE_EVERY_S)
        self._subscriptions[header[hub_ops.SUBSCRIPTION]] = Subscription(
            header[hub_ops.SUBSCRIPTION], header[hub_ops.CLIENT_ID], header[hub_ops.EVENT_INBOX], every, _copy(tree),
            volatile_due=now + every, last_sent=now, known_at=now)
        self._wake.set()
        return {hub_ops.TREE: tree, hub_ops.TREE_SEQ: 0}

    async def unsubscribe(self, header, message):
        """``health_unsubscribe`` (one-way)."""
        self._subscriptions.pop(header[hub_ops.SUBSCRIPTION], None)

    @property
    def subscribers(self) -> int:
        return len(self._subscriptions)

    async def run(self) -> None:
        """Rounds, while anyone subscribes, until cancelled."""
        while True:
            if not self._subscriptions:
                self._wake.clear()
                await self._wake.wait()
            else:
                try:
                    await asyncio.wait_for(self._wake.wait(), ROUND_S)
                except asyncio.TimeoutError:
                    pass
            self._wake.clear()
            if self._subscriptions:
                try:
                    await self.round()
                except Exception as e:  # a bug must not end the feed for every subscriber
                    print(f"monarch_nb hub: health feed round failed: {type(e).__name__}: {e}", file=sys.stderr)
            await asyncio.sleep(MIN_INTERVAL_S)

    async def round(self) -> None:
        """Build the tree once and send each subscriber what changed for it."""
        self._health.want(3 * ROUND_S)  # while anyone subscribes, agents keep statuses fresh
        tree = await self._health.build()
        self.rounds += 1
        now = time.monotonic()
        for sub in list(self._subscriptions.values()):
            if sub.client_id in self._clients.table:
                sub.known_at = now
            elif now - sub.known_at > ORPHAN_S:  # its client left without unsubscribing
                self._subscriptions.pop(sub.sub_id, None)
                continue
            volatile = now >= sub.volatile_due
            if volatile:
                sub.volatile_due = now + sub.volatile_every_s
            delta = health_tree.diff(sub.tree, tree, skip=None if volatile else health_tree.VOLATILE.__contains__)
            if delta is None and now - sub.last_sent < KEEPALIVE_S:
                continue
            if delta is not None:
                delta = _copy(delta)
                sub.tree = health_tree.apply(sub.tree, _copy(delta))
                sub.seq += 1
                self.deltas += 1
            sub.last_sent = now
            await self._send(sub, delta)

    async def _send(self, sub: Subscription, delta: dict | None) -> None:
        try:
            await self._net.send(sub.address, {envelope.OP: events.HEALTH_DELTA, events.CLUSTER: self._cluster_id,
                                               hub_ops.SUBSCRIPTION: sub.sub_id, hub_ops.TREE_SEQ: sub.seq,
                                               events.DELTA: delta})
        except zmq.ZMQError:  # the hub is closing its sockets: deltas are best effort (a gap resubscribes)
            pass
