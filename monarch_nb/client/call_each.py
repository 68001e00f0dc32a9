"""One call to the single actor of each of several actor meshes, sent as one: what a
service's ``fanout`` to its one-proc replicas does.

``[e.call_one(*args) for e in endpoints]`` pickles the arguments and builds a ``Gather``,
its port, closures and bookkeeping once per mesh. :func:`call_one_each` pickles once and
gathers every reply on one ``Gather`` (a port per mesh tells the replies apart: each
actor is rank 0 of its own mesh), so a fanout over N replicas costs about what one call
over an N-actor mesh does. Each mesh still gets its own ``Future``, with the same value,
errors, supervision, Ctrl-C interruption and ``choose()`` load as its ``call_one``.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable

from ..proc import call_chain
from ..protocol import envelope, proc_ops
from ..wire import frames as wire_frames
from ..wire import serialize
from ..wire.interrupts import guard_main_thread, protected
from ..wire.mailbox import Gather
from .endpoint import Endpoint, _read_reply, _timeout_hint
from .future import Future
from .in_flight import Call
from .runtime import runtime


@protected
def call_one_each(endpoints: list[Endpoint], args: tuple, kwargs: dict) -> list[Future]:
    """Call each endpoint's one actor with ``(*args, **kwargs)``; returns one ``Future``
    per endpoint, in order, as ``endpoint.call_one(*args, **kwargs)`` would. Non-blocking.

    Raises at once, before anything is sent, what ``call_one`` raises then:
    ``ValueError`` for a mesh of more than one actor, ``SerializationError`` for an
    argument that can't be pickled, a failure armed on one of the meshes. Arguments with
    out-of-band buffers (arrays, tensors) take ``call_one``'s own path, which sends them
    with care for dead actors and shared memory."""
    guard_main_thread()  # first: a cell's default SIGINT handler would not defer out of what follows
    if not endpoints:
        return []
    rt = runtime()
    supervision = rt.supervision
    for e in endpoints:
        if len(e._mesh) != 1:
            e.call_one(*args, **kwargs)  # raises its ValueError (naming the mesh), sending nothing
    for e in endpoints:
        supervision.raise_armed(e._mesh._cluster_id, e._mesh._name)
    first = endpoints[0]
    body, buffers = serialize.dumps((args, kwargs), f"an argument of {first._mesh._name}.{first._name}")
    if buffers:
        return [e.call_one(*args, **kwargs) for e in endpoints]
    head: dict = {envelope.KIND: proc_ops.CALL, proc_ops.ORIGIN: rt.origin()}
    chain = call_chain.current()
    if chain:
        head[proc_ops.CHAIN] = chain
    futures: list[Future] = [Future(rt, f"{e._mesh._name}.{e._name}") for e in endpoints]
    bases = [e._mesh._shape.base_rank(0) for e in endpoints]
    addresses = [e._mesh._addresses[b] for e, b in zip(endpoints, bases)]
    ports: list[int] = []
    answered: set[int] = set()

    @protected
    def on_reply(key: Hashable, message: wire_frames.Message) -> None:
        i = key if isinstance(key, int) else -1
        if i < 0 or i in answered:  # a reply and a supervision failure may both come
            return
        answered.add(i)
        e = endpoints[i]
        value, failure, interrupted = _read_reply(message, e._mesh.extent, 0)
        error = None
        if failure is not None:
            died = [failure] if message.header.get("supervision", False) else []
            error = e._error([failure], 1, died)
        supervision.unwatch(ports[i])
        if len(answered) == len(endpoints):
            gather.close()
        futures[i]._resolve(value, error)
        if interrupted is not None:
            raise interrupted  # the client's own Ctrl-C, now that the reply is accounted for

    gather = Gather(rt.mailbox, on_reply)
    deaths = supervision.deaths
    sent: list[int] = []
    for i, e in enumerate(endpoints):
        mesh = e._mesh
        route = gather.open(i)  # the port exists before anything is sent: a reply may arrive at once
        port = route[envelope.PORT]
        ports.append(port)
        dead = supervision.watch(mesh._cluster_id, port, {addresses[i]: bases[i]}, mesh._name)
        if dead:
            supervision.fail(mesh._cluster_id, port, bases[i], dead[addresses[i]])
        else:
            gather.send((addresses[i],), wire_frames.encode(mesh._cluster_id, {**head, proc_ops.ENDPOINT: e._name,
                                                                               **route}, body, (),
                                                            sign_at_send=True))
            sent.append(i)
    if supervision.deaths != deaths:
        for i in sent:
            endpoints[i]._drop_queued_for_dead([addresses[i]])
    for i, (e, future) in enumerate(zip(endpoints, futures)):
        mesh, base = e._mesh, bases[i]
        mesh._track([base], future)
        future._cycle = e._cycle_error({addresses[i]: base})
        rt.in_flight.add(future, Call(mesh, e._name, rt.cell, (rt.mailbox.address, ports[i]),
                                      functools.partial(_outstanding, answered, i, base)))
        future._why_slow = functools.partial(_timeout_hint, mesh, e._name, {base: 0})
    return futures


def _outstanding(answered: set[int], i: int, base: int) -> list[int]:
    """The base ranks of call ``i`` that have not answered (what Ctrl-C interrupts)."""
    return [] if i in answered else [base]
