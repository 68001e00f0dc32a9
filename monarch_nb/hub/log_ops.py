"""Log lines in the hub: stored (see ``logstore``), forwarded to the client whose call
caused each, flushed and queried on request."""

from __future__ import annotations

import asyncio
import functools
import re

from ..protocol import agent_ops, envelope, events, hub_ops
from ..wire.aio import AioEndpoint
from .clients import Clients
from .errors import HubError
from .logstore import LogStore
from .registry import Registry

FLUSH_TIMEOUT_S = 2.0  # how long a log flush waits for each host agent


class LogOps:
    """The log operations over the hub's ``store``: lines come from the host agents of
    ``registry`` and go to the clients of ``clients``."""

    def __init__(self, store: LogStore, registry: Registry, clients: Clients, net: AioEndpoint, cluster_id: str):
        self.store = store
        self._registry = registry
        self._clients = clients
        self._net = net
        self._cluster_id = cluster_id

    async def log_lines(self, header, message) -> None:
        """Store a batch from a host agent and pass each line on to the client whose call
        caused it (origin ``CLIENT_ID:...``); lines nobody's call caused, or a client's
        that takes no lines (a proc), go to every client. Lines of a call whose client is
        gone (a restarted kernel's, an ended script's) are only stored (``%monarch logs``):
        sent to every client, they showed under another notebook's running cell as its own."""
        records = self.store.add(header[agent_ops.HOST_ID], header["lines"])
        clients = self._clients.table
        by_client: dict[str, list] = {}
        for record in records:
            origin = record[7]
            owner = origin.partition(":")[0] if origin else None
            if owner in clients and clients[owner].wants_lines:
                targets = [owner]
            elif owner is not None and owner not in clients:
                continue
            else:
                targets = [c for c, r in clients.items() if r.wants_lines]
            for client_id in targets:
                by_client.setdefault(client_id, []).append(record)
        for client_id, batch in by_client.items():
            client = clients[client_id]
            if client.log_address:
                client.log_seq += 1
                await self._net.send(client.log_address, {envelope.OP: events.LOG_LINES,
                                                          events.CLUSTER: self._cluster_id,
                                                          "seq": client.log_seq, "records": batch})

    async def logs_flush(self, header, message):
        """Every line written by any proc before this request has been forwarded when the
        reply comes; it says how many batches this client has been sent."""
        hosts = [h for h in self._registry.hosts.values() if not h.lost]  # a lost one would only time out
        drained = await asyncio.gather(*(self._net.request(h.address, {envelope.OP: agent_ops.DRAIN_LOGS},
                                                           timeout=FLUSH_TIMEOUT_S) for h in hosts),
                                       return_exceptions=True)
        client = self._clients.table.get(header.get("client_id"))
        late = [h.hostname or h.host_id for h, d in zip(hosts, drained) if isinstance(d, BaseException)]
        return {"seq": client.log_seq if client else 0, hub_ops.UNDRAINED: late}

    async def logs_query(self, header, message):
        """Records matching the filters (see ``LogStore.query``). The query runs in a
        worker thread: reading a store past its ring from disk takes seconds, and the
        event loop must go on hearing host agents meanwhile."""
        query = functools.partial(self.store.query, header.get("mesh"), header.get("ranks"), header.get("stream"),
                                  header.get("since"), header.get("grep"), header.get("tail"),
                                  header.get("after_seq", 0))
        try:
            records = await asyncio.get_running_loop().run_in_executor(None, query)
        except re.error as e:
            raise HubError(f"bad grep pattern {header.get('grep')!r}: {e}", "ValueError") from None
        return {"records": records, "last_seq": self.store.seq}
