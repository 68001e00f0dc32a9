"""Where a client receives: its inboxes (replies, forwarded lines) must be reachable
from every proc of the clusters it talks to.

A client binds on loopback unless ``MONARCH_NB_BIND`` says otherwise. A cluster
whose hub is on another interface (a multi-host cluster) needs the client's inboxes
on the interface that routes to that hub; this is chosen when the process first
connects, before any inbox exists. A process whose inboxes already listen on
loopback can't talk to such a cluster, and is told so.
"""

from __future__ import annotations

import os

from ..errors import ClusterError
from ..wire import interfaces, sockets
from .runtime import runtime


def receive_from(hub_address: str) -> None:
    """Make this process's inboxes reachable from the cluster whose hub is at
    ``hub_address``. Nothing to do for a hub on loopback or when ``MONARCH_NB_BIND``
    is set (the user or a host agent chose). Raises :class:`ClusterError` when the
    inboxes already listen on loopback and the hub is elsewhere."""
    if "MONARCH_NB_BIND" in os.environ:
        return
    try:
        want = interfaces.route_source(interfaces.host_of(hub_address))
    except OSError as e:
        raise ClusterError(f"no route to the hub at {hub_address}: {e}") from None
    if want == sockets.bind_host():
        return
    if runtime().receiving:
        raise ClusterError(
            f"this process already receives on {sockets.bind_host()}, which the procs of the cluster whose hub "
            f"is at {hub_address} can't reach; connect from a new process (restart the kernel), or set "
            f"MONARCH_NB_BIND={want} before the first cluster")
    os.environ["MONARCH_NB_BIND"] = want
