"""Ports: the sending end of a reply route, as a value (Monarch's ``Port``).

A port names a mailbox port in some process (``address``, ``port``) and the rank its
values are sent as. Every reply an actor sends goes through :func:`deliver`; a
:class:`Port` is the same route handed to user code: an endpoint declared with
``explicit_response_port=True`` gets its caller's port as first argument, and
``Channel.open()`` makes one whose values a ``PortReceiver`` receives. A port pickles
to its route only, so it may travel as an argument to another actor, which then sends
through it straight to the receiver's inbox, signed like every message; a client's port
in the arguments of a call that came through a host router sends through that router
instead (:func:`unpickling_routed`), as the call's replies do.

Signing needs the key of the cluster both ends trust. A port made in a proc carries
its cluster; a port made in a client (``cluster_id`` ``None``) is re-bound, when
unpickled in a proc, to that proc's cluster (the client trusts the keys of every
cluster it attached to); one sent from its own client process signs for the cluster of
the ``this_proc()`` actor sending it (as that actor's replies do), or else with any key
the client trusts (its receiver is in the same process, which verifies with the same
keys).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Generic, TypeVar

from ..protocol import envelope
from . import frames as wire_frames
from . import sockets
from .remote_error import pack_exception

_local = {"cluster": None, "outbox": None}  # this proc's cluster; the outbox ports send through
_outbox_lock = threading.Lock()
_actor_thread = threading.local()  # .outbox, .cluster: an actor thread's (bind_actor_thread)
# While an actor's thread unpickles a call that came through a host router: that router
# and the client that made the call (see ``unpickling_routed``).
_routed = threading.local()


def bind_cluster(cluster_id: str) -> None:
    """Called once by a proc's entry point: ports unpickled here sign for its cluster."""
    _local["cluster"] = cluster_id


def local_cluster() -> str | None:
    """This proc's cluster (``None`` in a client)."""
    return _local["cluster"]


def use_outbox(outbox: sockets.Outbox) -> None:
    """Send ports' values through ``outbox``: the one this process's replies go through
    (a proc's, a client's mailbox). A thread's messages to one peer then leave on one
    socket, in the order sent; on two sockets, a call's reply could overtake the values
    its endpoint sent through a port before returning, and a receiver drops a message
    more than ``REPLAY_WINDOW`` behind the newest of its sender (``wire.frames``): an
    endpoint that sent a few thousand values and returned lost some."""
    with _outbox_lock:
        _local["outbox"] = outbox


def bind_actor_thread(outbox: sockets.Outbox, cluster_id: str) -> None:
    """This thread runs an actor of ``cluster_id`` whose replies leave through ``outbox``:
    the values it sends through ports leave there too (see :func:`use_outbox`), and a
    port made in a client signs for that cluster, as the replies do. Needed in a client,
    whose ``this_proc()`` actors are threads of a cluster of their own: its ports signed
    for the first cluster the client trusted, so their socket presented other credentials
    than the replies' one, and each switch closed the socket with what it still held (an
    endpoint that sent 5,000 values and returned lost some on a loaded machine)."""
    _actor_thread.outbox, _actor_thread.cluster = outbox, cluster_id


def _outbox() -> sockets.Outbox:
    mine = getattr(_actor_thread, "outbox", None)
    if mine is not None:
        return mine
    if _local["outbox"] is None:
        with _outbox_lock:
            if _local["outbox"] is None:
                _local["outbox"] = sockets.Outbox()
    return _local["outbox"]


def deliver(outbox: sockets.Outbox, cluster_id: str, address: str, port: int, rank: int | None,
            value=None, error: BaseException | None = None, what: str = "return value",
            extra: dict | None = None) -> None:
    """Send ``value`` (or ``error``) to ``port`` of the mailbox at ``address``, as ``rank``.

    A value that can't be pickled is turned into an error reply naming it. A CUDA tensor in
    ``value`` goes by CUDA IPC when ``address`` is a process of this host and the reply goes
    straight there (``wire.cuda_ipc``); one through a host router is staged."""
    header = {envelope.OK: True, envelope.PORT: port, envelope.RANK: rank}
    if extra:
        header.update(extra)
    # A port that is a route (client address, port) is a host router's (host.router): the
    # router may fold the value, or forward it to a client on another host.
    destinations = (address,) if isinstance(port, int) else None
    if error is None:
        try:
            frames = wire_frames.encode_value(cluster_id, header, value, what,
                                              sign_at_send=True, destinations=destinations)
        except Exception as e:  # SerializationError, MessageTooLarge, what its __getstate__ raised
            error = e
    if error is not None:
        frames = wire_frames.encode_value(cluster_id, {**header, envelope.OK: False}, pack_exception(error, 1))
    outbox.send(address, frames)


R = TypeVar("R")


class Port(Generic[R]):
    """Where values for one receiver go; :meth:`send` them in order, or an
    :meth:`exception` the receiver raises. Usable from any thread. A port with no
    ``address`` (a broadcast's, which nobody waits on) drops what it is sent."""

    __slots__ = ("address", "port", "rank", "cluster_id")

    def __init__(self, address: str | None, port, rank: int | None = None, cluster_id: str | None = None):
        # ``port``: a mailbox port number, or a route (client address, port[, relay])
        # where ``address`` is a host router that forwards to that client (through
        # that relay router).
        self.address = address
        self.port = port
        self.rank = rank
        self.cluster_id = cluster_id

    def send(self, value) -> None:
        """Send ``value`` to the receiver (fire and forget, in order with this port's
        other values). A value that can't be pickled reaches it as that error."""
        if self.address is not None:
            deliver(_outbox(), self._cluster(), self.address, self.port, self.rank, value=value,
                    what="a value sent through a port")

    def exception(self, exc: BaseException) -> None:
        """Make the receiver raise ``exc`` (a caller waiting on this port's call gets
        it as the call's error)."""
        if self.address is not None:
            deliver(_outbox(), self._cluster(), self.address, self.port, self.rank, error=exc)

    def _cluster(self) -> str:
        if self.cluster_id is not None:
            return self.cluster_id
        mine = getattr(_actor_thread, "cluster", None)
        if mine is not None:
            return mine
        trusted = wire_frames.trusted_clusters()
        if not trusted:
            raise RuntimeError("this port has no cluster to sign for: attach to a cluster first")
        return trusted[0]

    def __reduce__(self):
        return _rebuilt, (self.address, self.port, self.rank, self.cluster_id)

    def __repr__(self) -> str:
        return f"<Port {self.address} #{self.port}{'' if self.rank is None else f' rank {self.rank}'}>"


def _rebuilt(address: str | None, port, rank: int | None, cluster_id: str | None) -> Port:
    if address is not None and address == getattr(_routed, "client", None):
        # A port of the client whose call came through a host router goes back through it
        # too: the router forwards its values to the client with the call's replies, so
        # the client needs no connection from this actor (a route port: host.router),
        # through the relay the call came by, if any, as the replies go.
        upstream = getattr(_routed, "upstream", None)
        route = (address, port) if upstream is None else (address, port, upstream)
        return Port(_routed.router, route, rank, local_cluster() or cluster_id)
    return Port(address, port, rank, local_cluster() or cluster_id)


@contextlib.contextmanager
def unpickling_routed(router: str, client: str, upstream: str | None = None):
    """Unpickle a call's arguments in this block when the call came from ``client``
    through the host router at ``router`` (and, from the client, through the relay
    router ``upstream``): that client's ports in them send through the same routers."""
    _routed.router, _routed.client, _routed.upstream = router, client, upstream
    try:
        yield
    finally:
        _routed.router = _routed.client = _routed.upstream = None
