"""The events the hub sends to clients' event inboxes (a client's log receiver).

An event is a one-way message whose ``op`` is one of these names; every event carries
``CLUSTER`` (the cluster id).
"""

from __future__ import annotations

CLUSTER = "cluster"  # header key of every event: the id of the cluster it comes from

HEALTH_CHANGED = "health_changed"  # the registry changed (coalesced): ask for the health tree again
LOG_LINES = "log_lines"  # log records for this client (``seq``: its batch count, ``records``)
# (hub_ops.LOG_LINES, from host agents to the hub, is another message of the same name)
HEALTH_DELTA = "health_delta"  # a subscriber's tree changed (hub_ops.HEALTH_SUBSCRIBE): SUBSCRIPTION, TREE_SEQ, DELTA
DELTA = "delta"  # HEALTH_DELTA: what changed (protocol.health_tree), from version TREE_SEQ - 1 to TREE_SEQ
ACTORS_GONE = "actors_gone"  # actors died or were stopped: address -> (mesh, rank, why: the whole report)
# In ACTORS_GONE: the routers of the hosts lost (router address -> why): a client's calls
# relayed through one of them (router_ops.RELAY) fail, and it takes another relay
ROUTERS_GONE = "routers_gone"
ACTORS_BACK = "actors_back"  # actors of a lost host live again: address -> (mesh, rank)
SUPERVISION = "supervision"  # a failure no owning actor handled (``failure``)
DEBUG_CHANGED = "debug_changed"  # the list of threads paused in the debugger changed (``stops``, ``SEQ``)
SEQ = "seq"  # DEBUG_CHANGED and the DEBUG_PAUSED reply: [hub epoch, changes]: which list is newer
