"""Endpoint adverbs: ``call``, ``call_one``, ``choose``, ``stream``, ``broadcast``.

Each sends one signed message per target actor, straight to the actor's socket,
with this process's mailbox as reply-to, through one scatter/gather
(``wire.mailbox.Gather``): the arguments are pickled and signed once for all targets,
and the replies come back on one port, each naming its rank.
"""

from __future__ import annotations

import collections
import functools
import sys
import threading
from typing import Any, Awaitable, Callable, Concatenate, Generic, Iterator, Literal, ParamSpec, Protocol, TypeVar, overload

from ..errors import ActorError, CallCycleError, RemoteFailure, SerializationError, SupervisionError, reports_a_failure
from ..mesh import Extent
from ..proc import actor as proc_actor
from ..proc import call_chain
from ..protocol import envelope, proc_ops, router_ops
from ..wire import frames as wire_frames
from ..wire import serialize, shm, sockets
from ..wire.interrupts import guard_main_thread, protected
from ..wire.mailbox import Gather
from ..wire.port import Port
from ..wire.remote_error import unpack_exception
from .future import Future
from .in_flight import Call
from .mesh_handle import is_this_proc
from .presence import join_hub
from .runtime import runtime
from .value_mesh import ValueMesh

# "ActorMesh" in annotations names ``actor_mesh.ActorMesh``, not imported: that module
# imports this one, and a cycle, even for type checkers only, is one the layers forbid.


# In a call's results: a rank whose value a host router folded into another rank's (reduce()).
FOLDED_AWAY = object()


class _FoldFailed:
    """In a reduce's results: a router's fold of this rank's value raised ``error``
    (``router_ops.FOLD_FAILED``); the reduce raises it, as a fold here would."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


# Once an actor of a call died (its proc living on), how long (seconds) the call still waits for its other
# ranks to answer or die before it raises (see ``Endpoint._gather``).
DEATH_GRACE_S = 0.5
# A rank raised and the call still waits for others this long after (seconds): say so on
# stderr (under the cell), once. Ranks waiting on the failed one (a collective it never
# joins) never answer, and the call waited in silence until its timeout, or for ever.
RAISED_NOTICE_S = 5.0

P = ParamSpec("P")
R = TypeVar("R")


class Endpoint(Generic[P, R]):
    """``mesh.NAME``: an endpoint of every actor of a mesh (or slice).

    For a type checker, an endpoint ``def train(self, step: int) -> float`` is
    ``Endpoint[(step: int), float]``: ``call`` takes the method's arguments and gives a
    ``Future[ValueMesh[float]]`` (see ``monarch_nb.actor.endpoint``).
    """

    def __init__(self, mesh: "ActorMesh", name: str):
        self._mesh = mesh
        self._name = name

    def __repr__(self) -> str:
        return f"<Endpoint {self._mesh._name}.{self._name} over {dict(self._mesh.extent)}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        # Typed as the method: in the actor's own code ``self.train(1)`` is the plain
        # method, and a type checker sees the same attribute there as on a mesh.
        raise TypeError(
            f"endpoint {self._name!r} is not called directly; use .call(...) for every actor, "
            f".call_one(...) for a single actor, .choose(...), .stream(...) or .broadcast(...)")

    # sending: protected, so that Ctrl-C never sends a call to only some of its ranks,
    # or sends one whose reply has no port yet (``wire.interrupts``) --------------------
    def _addresses_of(self, view_ranks: list[int]) -> list[str]:
        mesh = self._mesh
        return [mesh._addresses[b] for b in mesh._shape.base_ranks_of(view_ranks)]

    @protected
    def _send(self, addresses: list[str], args: tuple, kwargs: dict, gather: Gather | None = None,
              route: dict | None = None, deaths: int | None = None, reducer: Callable | None = None) -> dict | None:
        """Pickle and sign the arguments once; send them to the actors at ``addresses``
        (see :meth:`_addresses_of`), replies routed by ``route`` (none for broadcast).
        ``deaths``: ``Supervision.deaths`` when the caller last checked its targets alive.
        A mesh called through the host routers (``host_routes``) gets one message per
        host instead, asking the routers to fold the values with ``reducer`` if given.
        Returns those routes (``HostRoutes.routes``), ``None`` when it went straight to
        the actors."""
        guard_main_thread()  # first: a cell's default SIGINT handler would not defer out of what follows
        mesh = self._mesh
        rt = runtime()
        presence = rt.presences.get(mesh._cluster_id)
        if (presence is None or presence.closed) and proc_actor.proc_identity() is not None \
                and not is_this_proc(mesh._cluster_id):
            join_hub(mesh._cluster_id, mesh._hub_address)  # an actor's call: it hears of deaths too
        if deaths is None:
            deaths = rt.supervision.deaths
        rt.supervision.raise_armed(mesh._cluster_id, mesh._name)
        header: dict = {envelope.KIND: proc_ops.CALL, proc_ops.ENDPOINT: self._name, proc_ops.ORIGIN: rt.origin(),
                        proc_ops.VIEW: mesh._shape.spec()}  # (each actor's message_rank: its point there)
        chain = call_chain.current()
        if chain and route is not None:  # a broadcast: nobody waits on it, so it holds nobody up
            header[proc_ops.CHAIN] = chain
        if route is not None:
            header.update(route)
        routes = rt.host_routes.routes(mesh)
        if routes is not None:
            self._cast(routes, addresses, header, args, kwargs, reducer, coalesce=gather is not None,
                       port=None if gather is None or route is None else route[envelope.PORT])
            return routes
        frames = wire_frames.encode_value(mesh._cluster_id, header, (args, kwargs),
                                          what=f"an argument of {mesh._name}.{self._name}", sign_at_send=True,
                                          destinations=addresses)  # CUDA tensors by IPC when all on this host
        gather = gather or Gather(rt.mailbox)
        if len(frames) <= wire_frames.FIXED_FRAMES:  # no out-of-band buffers: the usual case
            gather.send(addresses, frames)
            if rt.supervision.deaths != deaths:
                self._drop_queued_for_dead(addresses)
            return None
        # Buffers: a send may take a while, and waits until they have left. An actor
        # reported dead meanwhile is skipped (its call has failed already): a send to it
        # would wait for a peer that never reads, up to Outbox's drain timeout.
        rank_of = {a: base for base, a in enumerate(mesh._addresses)}

        def send_to_live() -> None:  # (its loop in a function of its own: see monarch_nb.wire.interrupts)
            for address in addresses:
                if rt.supervision.why_dead(mesh._cluster_id, address, mesh._name, rank_of.get(address)) is None:
                    gather.send([address], frames)

        with shm.sharing():  # a large argument written to shared memory once for this host's actors
            send_to_live()
        # Large buffers may wait in shared-memory segments: an actor whose death was reported
        # while this was being sent would never take its segment (actors_gone dropped the
        # segments before it existed).
        if wire_frames.signed_at_send(frames) or rt.supervision.deaths != deaths:
            self._drop_queued_for_dead(addresses)
        return None

    def _cast(self, routes: dict, addresses: list[str], header: dict, args: tuple, kwargs: dict,
              reducer: Callable | None, coalesce: bool, port: int | None) -> None:
        """One ``CAST`` to the mesh's relay router, which passes it on to the other
        hosts' (``router_ops.RELAY``), or, relays off, one per host router
        (``host.router``): the call's header and arguments once, and the actors of
        ``addresses`` on each host. ``coalesce``: the replies go to a :meth:`_gather`,
        which takes identical ones as one (``router_ops.SAME``). ``port``: that gather's,
        which fails if the relay's host is lost while it waits."""
        mesh, rt = self._mesh, runtime()
        body, buffers = serialize.dumps((args, kwargs), f"an argument of {mesh._name}.{self._name}")
        raw = [b.raw() for b in buffers]
        by_router = rt.host_routes.by_router(routes, addresses)
        mailbox, supervision = rt.mailbox, rt.supervision
        cast: dict = {envelope.OP: router_ops.CAST, router_ops.CALL: header, router_ops.CLIENT: mailbox.address}
        if reducer is not None:
            try:
                cast[router_ops.REDUCE] = serialize.dumps(reducer, "the reducer")[0]
            except SerializationError:
                pass  # the routers pass the values on, and this client folds them, as it does for a direct call
        if coalesce:
            cast[router_ops.COALESCE] = True
        relay = rt.host_routes.relay(mesh._cluster_id, mesh._key, by_router, supervision.router_lost)
        if relay is not None:
            cast[router_ops.TARGETS] = by_router.pop(relay, [])
            if by_router:
                cast[router_ops.RELAY] = by_router
            if port is not None:
                supervision.watch_relay(mesh._cluster_id, port, relay)
            mailbox.send(relay, wire_frames.encode(mesh._cluster_id, cast, body, raw, sign_at_send=True))
            return
        for router, targets in by_router.items():
            cast[router_ops.TARGETS] = targets
            mailbox.send(router, wire_frames.encode(mesh._cluster_id, cast, body, raw, sign_at_send=True))

    def _drop_queued_for_dead(self, addresses: list[str]) -> None:
        """Actors reported dead while a call to them was being sent: its socket to each
        (and shared-memory segments), closed for them by ``Supervision.actors_gone``
        before the send made them again, would hold the call until a new actor took the
        address, and deliver it there (a restarted rank ran a call that had already
        failed)."""
        mesh, supervision = self._mesh, runtime().supervision
        rank_of = {a: base for base, a in enumerate(mesh._addresses)}
        for address in addresses:
            if supervision.why_dead(mesh._cluster_id, address, mesh._name, rank_of.get(address)) is not None:
                sockets.Outbox.discard(address)

    @protected
    def _gather(self, view_ranks: list[int], args, kwargs, finish, reducer: Callable | None = None) -> Future:
        """Send to ``view_ranks``; once all replied, ``finish(results, failures, dead)`` gives the
        future's ``(value, error)``. With ``reducer``, routers may fold several ranks'
        values into one reply (``FOLDED``): the ranks it covers besides its own hold
        ``FOLDED_AWAY`` in ``results``. Without, routers send identical replies as one
        (``SAME``): each rank it names gets the value as if its own reply had come."""
        guard_main_thread()  # first: a cell's default SIGINT handler would not defer out of what follows
        mesh = self._mesh
        rt = runtime()
        supervision = rt.supervision
        future: Future = Future(rt, f"{mesh._name}.{self._name}")
        shape, addresses = mesh._shape, mesh._addresses
        bases = shape.base_ranks_of(view_ranks)
        by_base = {b: i for i, b in enumerate(bases)}
        results: list[Any] = [None] * len(view_ranks)
        failures: dict[int, RemoteFailure] = {}
        remaining = [len(view_ranks)]

        answered: set[int] = set()
        dead_ranks: set[int] = set()  # failed by supervision (not an endpoint that raised)
        targets = {addresses[b]: b for b in bases}
        grace: list = []  # the timer that ends the wait on the ranks still out once one died
        notice: list = []  # the timer that tells of a rank that raised while others run on

        def settle() -> None:
            remaining[0] = 0
            for timer in (*grace, *notice):
                timer.cancel()
            gather.close()
            supervision.unwatch(port)
            try:  # what finishing raises (a reducer's, sys.exit's too) is the call's error: no future left waiting
                value, error = finish(results, [failures[k] for k in sorted(failures)],
                                      [failures[k] for k in sorted(dead_ranks)])
            except BaseException as e:  # noqa: BLE001
                value, error = None, e
            future._resolve(value, error)

        @protected
        def on_reply(_key, message: wire_frames.Message) -> None:
            if message.header.get(proc_ops.GRACE_OVER):
                if remaining[0]:
                    settle()
                return
            if message.header.get(router_ops.RELAY_LOST):  # every rank still out went with the relay
                if remaining[0]:
                    _, lost, _ = _read_reply(message, mesh.extent, view_ranks[0])
                    error = lost.exception if lost is not None else SupervisionError("the relay router was lost")
                    for j in range(len(view_ranks)):
                        if j not in answered:
                            failures[j] = RemoteFailure(mesh.extent.point(view_ranks[j]), error, "")
                            dead_ranks.add(j)
                    settle()
                return
            i = by_base.get(message.header["rank"])
            if i is None or i in answered:  # a reply and a supervision failure may both come
                return
            answered.add(i)
            folded = message.header.get(router_ops.FOLDED)  # a router folded these ranks' values into this one
            same = message.header.get(router_ops.SAME)  # these ranks' replies were this one, byte for byte
            covered = folded if folded is not None else same
            also = [] if covered is None else [by_base[b] for b in covered
                                               if b in by_base and by_base[b] not in answered]
            answered.update(also)
            value, failure, interrupted = _read_reply(message, mesh.extent, view_ranks[i])
            if failure is not None and message.header.get(router_ops.FOLD_FAILED):
                value, failure = _FoldFailed(failure.exception), None  # the reducer's error, not the rank's
            if failure is None:
                results[i] = value
                for j in also:
                    if folded is not None:
                        results[j] = FOLDED_AWAY
                    elif type(value) in _SHAREABLE:  # one object may stand for every rank's
                        results[j] = value
                    else:  # each rank's own object, as if its reply had come (never raises)
                        results[j], failure_j = _unpickle_reply(message, mesh.extent, view_ranks[j])
                        if failure_j is not None:
                            failures[j] = failure_j
            else:
                failures[i] = failure
                for j in also:
                    failures[j] = RemoteFailure(mesh.extent.point(view_ranks[j]), failure.exception, failure.traceback)
            remaining[0] -= 1 + len(also)
            died = i in failures and message.header.get(proc_ops.DIED, False)
            if died:
                dead_ranks.add(i)
                if message.header.get(proc_ops.ALONE):  # the actor's own word that it died
                    # Known gone here now, not only once the hub's event comes (restart()
                    # of the failed ranks, right after this call raised, found none).
                    supervision.heard_dead(mesh._cluster_id, addresses[bases[i]], mesh._name, bases[i],
                                           str(failures[i].exception))
                # Ranks that died with it (a stopped mesh, a lost host) are named too.
                for base, j in by_base.items():
                    why = None if j in answered else supervision.why_dead(mesh._cluster_id, mesh._addresses[base],
                                                                          mesh._name, base)
                    if why is not None:
                        answered.add(j)
                        remaining[0] -= 1
                        failures[j] = RemoteFailure(mesh.extent.point(view_ranks[j]), SupervisionError(why), "")
                        dead_ranks.add(j)
            if remaining[0] <= 0 or (died and not message.header.get(proc_ops.ALONE)):
                settle()
            elif died and not grace:
                # An actor died (its proc lives on: an endpoint raised a BaseException):
                # the ranks still out, running the same code, may be dying of the same cause (every rank of a mesh raising in one
                # call). Wait for them a little, so that the error names every rank that
                # died and each of their failures is with the mesh's owner before it is
                # raised (each dying rank answers only once the owner has its failure:
                # hub.supervision); a rank running a long endpoint (in a collective the
                # dead rank never joins) holds the error no longer than this. A proc's
                # death (a signal, the OOM killer) comes from outside the call: it fails
                # the call at once, as it did.
                grace.append(supervision.end_grace_later(mesh._cluster_id, port, DEATH_GRACE_S))
            elif failures and not notice:
                notice.append(_notice_later(f"{mesh._name}.{self._name}", failures, remaining))
            if interrupted is not None:
                raise interrupted  # the client's own Ctrl-C, now that the reply is accounted for

        # The port exists before anything is sent: a reply may arrive at once.
        gather = Gather(rt.mailbox, on_reply)
        route = gather.open()
        port = route[envelope.PORT]
        deaths = supervision.deaths
        dead = supervision.watch(mesh._cluster_id, port, targets, mesh._name)
        try:
            routes = self._send([addresses[b] for b in bases if addresses[b] not in dead], args, kwargs, gather,
                                route, deaths, reducer)
        except BaseException:
            gather.close()
            supervision.unwatch(port)
            raise
        for address, why in dead.items():
            supervision.fail(mesh._cluster_id, port, targets[address], why)
        mesh._track(bases, future)
        future._cycle = self._cycle_error(targets)
        rt.in_flight.add(future, Call(mesh, self._name, rt.cell, (route[envelope.REPLY], port),
                                      lambda: [b for b, i in by_base.items() if i not in answered],
                                      None if routes is None else lambda b: routes[addresses[b]][0]))
        future._ranks = len(view_ranks)
        future._why_slow = lambda: _raised_hint(failures) + _timeout_hint(mesh, self._name, by_base)
        future._answered = lambda: len(view_ranks) - remaining[0]
        return future

    def _cycle_error(self, targets) -> CallCycleError | None:
        """What waiting on a call to ``targets`` (addresses) raises when one of them is
        held up waiting on this caller (``proc.call_chain``); ``None`` when none is."""
        cycle = call_chain.cycle(call_chain.current(), targets)
        if cycle is None:
            return None
        waiting = cycle[-1]
        path = " → ".join([*cycle, cycle[0]]) if len(cycle) > 1 else f"{waiting} → {waiting}"
        what = "itself" if len(cycle) == 1 else f"{cycle[0]}, which is waiting on it"
        return CallCycleError(
            f"waiting on {self._mesh._name}.{self._name} would deadlock: {waiting} would wait on {what} "
            f"(call cycle {path}), and an actor runs one call at a time. Call it without waiting "
            f"(broadcast, or keep the future), make the waiting endpoint a @concurrent_endpoint, "
            f"or run the work in a helper method instead of an endpoint call", cycle)

    def _error(self, failures: list[RemoteFailure], total: int,
               dead: list[RemoteFailure]) -> ActorError | SupervisionError:
        """``SupervisionError`` when a rank's actor or proc is gone (``dead``), else
        ``ActorError``. The former starts as Monarch's does (``Endpoint call M.E() failed,``)
        then gives each gone rank's report; when one failed (rather than being stopped),
        a note (PEP 678: shown under the traceback, not part of ``str()``, which programs
        written for Monarch match) says how to get it back."""
        if dead:
            reports = "\n".join(str(f.exception) for f in dead)
            count = f"\n({len(dead)} of {total} ranks)" if total > 1 else ""
            raised = {i: f for i, f in enumerate(failures) if not any(f is d for d in dead)}
            if raised:  # (lost from the message before: a call stopped after a rank raised said only "stopped")
                count += f"\nbefore that, {_raised(raised)}"
            error = SupervisionError(f"Endpoint call {self._mesh._name}.{self._name}() failed, {reports}{count}",
                                     failures)
            if any(reports_a_failure(str(f.exception)) for f in dead) and hasattr(error, "add_note"):  # 3.11+
                error.add_note(f"To recover: restart() on actor mesh {self._mesh._name!r} restarts its failed "
                               f"ranks, procs.restart_failed() every failed proc of its proc mesh")
            return error
        return ActorError(self._mesh._name, self._name, failures, total)

    # adverbs ---------------------------------------------------------------------------
    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[ValueMesh[R]]:
        """Call every actor of the mesh; the future's value is a :class:`ValueMesh` over
        the mesh's extent. If any rank raised, ``get()`` raises one
        :class:`ActorError` listing every failed rank. If a rank's actor died (its proc
        living on), it raises :class:`SupervisionError` once every rank has answered or died, or
        ``DEATH_GRACE_S`` seconds after that death, whichever comes first: it names every
        rank that died by then, and the mesh's owner has each of those failures queued
        before it is raised. A proc's death fails it at once. Non-blocking."""
        mesh = self._mesh
        ranks = list(range(len(mesh)))

        def finish(results, failures, dead):
            if failures:
                return None, self._error(failures, len(ranks), dead)
            return ValueMesh(mesh.extent, results), None

        return self._gather(ranks, args, kwargs, finish)

    def reduce(self, reducer: Callable[[R, R], R], *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call every actor of the mesh and fold their return values with ``reducer``,
        an associative function of two values (``operator.add``, ``max``, a function of
        your own that pickles): the future's value is the fold of every rank's value, in
        no set order. Where the mesh is called through the host routers, each router
        folds its host's values, so this client receives one value per host. If any rank
        raised, ``get()`` raises :class:`ActorError` (or :class:`SupervisionError`) as
        :meth:`call` does; otherwise what ``reducer`` raised, wherever it ran. A router
        runs ``reducer`` in its host agent: one defined in the notebook (``__main__``)
        travels by value; one that can't be pickled, or whose module a host agent can't
        import, folds here instead (the same value, one message per actor). Non-blocking."""
        if not callable(reducer):
            raise TypeError(f"reduce() takes a function of two values first (e.g. operator.add), not {reducer!r}")
        ranks = list(range(len(self._mesh)))

        def finish(results, failures, dead):
            if failures:
                return None, self._error(failures, len(ranks), dead)
            for r in results:
                if isinstance(r, _FoldFailed):  # at a router
                    return None, r.error
            # What the user's reducer raises, the future raises (_gather's settle).
            return functools.reduce(reducer, [r for r in results if r is not FOLDED_AWAY]), None

        return self._gather(ranks, args, kwargs, finish, reducer)

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call the single actor of a one-actor mesh (e.g. ``mesh.slice(gpus=0)``); the
        future's value is its return value. Raises ``ValueError`` at once when the mesh
        holds more than one actor."""
        size = len(self._mesh)
        if size != 1:
            raise ValueError(
                f"call_one needs a mesh of exactly 1 actor, but {self._mesh._name} has {size} "
                f"(extent {dict(self._mesh.extent)}); slice it first, e.g. "
                f"mesh.slice({self._mesh.extent.labels[-1]}=0), or use .call() or .choose()")
        return self._one(0, args, kwargs)

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call one live actor of the mesh, the one with the fewest calls outstanding
        from this client (round-robin among equals); the future's value is its return
        value. Actors supervision reported dead are never chosen; when none is left the
        future raises :class:`SupervisionError` saying so."""
        chosen = self._mesh._least_loaded()
        if chosen is None:
            future: Future = Future(runtime(), f"{self!r}.choose()")
            future._resolve(error=self._none_alive())
            return future
        return self._one(chosen, args, kwargs)

    def _none_alive(self) -> SupervisionError:
        return SupervisionError(
            f"{self._mesh._name}.{self._name}.choose(): no live actor left among the {len(self._mesh)} of mesh "
            f"{self._mesh._name!r} (all failed); restart them with procs.restart_failed() or mesh.restart()")

    def _one(self, view_rank: int, args, kwargs) -> Future:
        def finish(results, failures, dead):
            if failures:
                return None, self._error(failures, 1, dead)
            return results[0], None

        return self._gather([view_rank], args, kwargs, finish)

    def stream(self, *args: P.args, **kwargs: P.kwargs) -> Iterator[Future[R]]:
        """Call every actor now; the returned iterator yields one done future per
        actor, in the order replies arrive, blocking until the next one has. A failed
        rank's future raises :class:`ActorError` from ``get()``."""
        mailbox = runtime().mailbox
        ranks = list(range(len(self._mesh)))
        arrived: collections.deque = collections.deque()
        self._call_each(ranks, args, kwargs, arrived.append)
        cycle = self._cycle_error(set(self._mesh._addresses[b] for b in self._mesh._shape.base_ranks_of(ranks)))
        if cycle is not None:
            raise cycle

        def replies() -> Iterator[Future]:
            for _ in ranks:
                mailbox.wait(lambda: bool(arrived))
                yield arrived.popleft()

        return replies()

    @protected
    def _call_each(self, ranks: list[int], args, kwargs, on_done) -> None:
        for r in ranks:
            self._one(r, args, kwargs).add_done_callback(on_done)

    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Send to every actor without waiting for or returning results (fire and
        forget). An exception in the endpoint is printed to that proc's stderr.

        Raises :class:`SupervisionError`, the error ``call(...).get()`` raises, when an
        actor of the mesh is known gone (the mesh or its procs were stopped, a proc
        died): after sending to the others, as a call runs on them."""
        mesh = self._mesh
        ranks = list(range(len(mesh)))
        addresses = self._addresses_of(ranks)
        dead = runtime().supervision.dead_among(mesh._cluster_id, addresses, mesh._name, mesh._addresses.index)
        if not dead:  # the usual case
            self._send(addresses, args, kwargs)
            return
        live = [address for address in addresses if address not in dead]
        if live:
            self._send(live, args, kwargs)
        gone = [RemoteFailure(mesh.extent.point(r), SupervisionError(dead[address]), "")
                for r, address in zip(ranks, addresses) if address in dead]
        error = self._error(gone, len(ranks), gone)
        if live and hasattr(error, "add_note"):  # Python >= 3.11
            error.add_note(f"broadcast: sent to the {len(live)} other ranks")
        raise error


class EndpointProperty(Protocol[P, R]):
    """What a type checker sees for a method decorated with :func:`endpoint`: read on a
    mesh (which a type checker sees as the actor class, see ``ProcMesh.spawn``) or on an
    actor, it is an :class:`Endpoint` with the method's parameters and result. At run
    time the decorated method is the method itself."""

    @overload
    def __get__(self, instance: None, owner: type) -> "EndpointProperty[P, R]": ...

    @overload
    def __get__(self, instance: object, owner: type) -> Endpoint[P, R]: ...

    def __get__(self, instance: object, owner: type) -> Any: ...


@overload
def endpoint(fn: Callable[Concatenate[Any, P], Awaitable[R]], *, propagate: Any = None,
             explicit_response_port: Literal[False] = False) -> EndpointProperty[P, R]: ...


@overload
def endpoint(fn: Callable[Concatenate[Any, P], R], *, propagate: Any = None,
             explicit_response_port: Literal[False] = False) -> EndpointProperty[P, R]: ...


@overload
def endpoint(fn: None = None, *, propagate: Any = None,
             explicit_response_port: bool = False) -> Callable[[Callable[..., Any]], Any]: ...


@overload
def endpoint(fn: Callable[..., Any], *, propagate: Any = None, explicit_response_port: bool) -> Any: ...


def endpoint(fn: Callable[..., Any] | None = None, *, propagate: Any = None,
             explicit_response_port: bool = False) -> Any:
    """Mark an ``Actor`` method as callable from clients; see
    :func:`monarch_nb.proc.actor.endpoint` for the options. This is the public name: its
    overloads let a type checker check ``mesh.method.call(...)`` against the method's
    signature (``@endpoint()`` and explicit-port endpoints are left unchecked)."""
    return proc_actor.endpoint(fn, propagate=propagate, explicit_response_port=explicit_response_port)


@overload
def concurrent_endpoint(fn: Callable[Concatenate[Any, P], Awaitable[R]], *, propagate: Any = None,
                        explicit_response_port: Literal[False] = False) -> EndpointProperty[P, R]: ...


@overload
def concurrent_endpoint(fn: None = None, *, propagate: Any = None,
                        explicit_response_port: bool = False) -> Callable[[Callable[..., Any]], Any]: ...


def concurrent_endpoint(fn: Callable[..., Any] | None = None, *, propagate: Any = None,
                        explicit_response_port: bool = False) -> Any:
    """:func:`monarch_nb.proc.actor.concurrent_endpoint`, typed as :func:`endpoint`."""
    return proc_actor.concurrent_endpoint(fn, propagate=propagate, explicit_response_port=explicit_response_port)


def as_endpoint(not_an_endpoint: Any, *, propagate: Any = None, explicit_response_port: bool = False) -> Any:
    """Monarch's way to call a method that is not an ``@endpoint``
    (``as_endpoint(mesh.method).call(...)``). monarch_nb's procs run only methods marked
    ``@endpoint`` (a mesh attribute naming any other method raises ``AttributeError``),
    so this always raises ``NotImplementedError``: decorate the method with
    ``@endpoint`` (or ``@endpoint(explicit_response_port=True)``) instead."""
    raise NotImplementedError(
        "monarch_nb has no as_endpoint: its actors answer only methods marked @endpoint; decorate the method "
        "with @endpoint and call it as mesh.METHOD.call(...)")


def send(endpoint: Endpoint, args: tuple, kwargs: dict, port: Port | None = None,
         selection: str = "all") -> None:
    """Monarch's lowest-level send: call ``endpoint`` on every actor (``selection``
    ``"all"``) or on one live actor (``"choose"``) without a future; each actor's return
    value (or error) goes to ``port`` (tagged with its rank), or nowhere without one.
    Raises :class:`SupervisionError` for ``"choose"`` when no actor is left alive."""
    if selection not in ("all", "choose"):
        raise ValueError(f"selection must be 'all' or 'choose', not {selection!r}")
    mesh = endpoint._mesh
    if selection == "all":
        ranks = list(range(len(mesh)))
    elif (chosen := mesh._least_loaded()) is not None:
        ranks = [chosen]
    else:
        raise endpoint._none_alive()
    route = None if port is None else {envelope.PORT: port.port, envelope.REPLY: port.address}
    endpoint._send(endpoint._addresses_of(ranks), args, kwargs, route=route)


def _read_reply(message: wire_frames.Message, extent: Extent,
                rank: int) -> tuple[Any, RemoteFailure | None, KeyboardInterrupt | None]:
    """``(value, failure, interrupt)`` of one actor's reply: its value, or the failure it
    reports (or ours to unpickle it), for the actor at ``rank`` of ``extent``.

    Under a SIGINT handler of the user's own (the runtime's defers Ctrl-C out of this),
    the client's own KeyboardInterrupt can land while the reply is unpickled: it is not
    the actor's error. The reply is then unpickled again (unpickling has no effect but
    its value) and the interrupt returned, for the caller to raise once the reply is
    accounted for. A KeyboardInterrupt on the second try too is the value's own."""
    try:
        return (*_unpickle_reply(message, extent, rank), None)
    except KeyboardInterrupt as e:
        interrupted = e
    try:
        return (*_unpickle_reply(message, extent, rank), interrupted)
    except KeyboardInterrupt as e:
        return None, RemoteFailure(extent.point(rank), e, f"could not unpickle the reply: {e!r}\n"), None


def _unpickle_reply(message: wire_frames.Message, extent: Extent, rank: int) -> tuple[Any, RemoteFailure | None]:
    """``(value, None)`` or ``(None, failure)``; raises only KeyboardInterrupt. The
    point is made for a failure only: a value needs none, and making it for every reply
    was a tenth of the client's work per reply."""
    try:
        value = message.value()
        if message.header[envelope.OK]:
            return value, None
        exc, tb = unpack_exception(value)
        return None, RemoteFailure(extent.point(rank), exc, tb)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - a value we can't unpickle here (even SystemExit)
        return None, RemoteFailure(extent.point(rank), e, f"could not unpickle the reply: {e!r}\n")


# Values one object of which may stand for every rank whose reply was the same
# (``router_ops.SAME``): nothing can change them. Any other value is unpickled once per
# rank, so that no two ranks' values are one object.
_SHAREABLE = frozenset((type(None), bool, int, float, complex, str, bytes))


def _raised(failures: dict[int, RemoteFailure]) -> str:
    """``rank(s) {..} raised E: text`` (the first one's error) for the ranks of a call
    that raised so far."""
    points = [failures[k].point for k in sorted(failures)]
    first = failures[min(failures)].exception
    which = f"{'rank' if len(points) == 1 else 'ranks'} {', '.join(map(str, points))}"
    return f"{which} raised {type(first).__name__}: {first}"


def _raised_hint(failures: dict[int, RemoteFailure]) -> str:
    """For a call that timed out: the ranks that raised meanwhile (``""`` if none): those
    still running may be waiting on them."""
    if not failures:
        return ""
    return f"; {_raised(dict(failures))} (the ranks still out may be waiting on them, e.g. in a collective)"


def _notice_later(call: str, failures: dict[int, RemoteFailure], remaining: list[int]) -> threading.Timer:
    """In ``RAISED_NOTICE_S``, say on stderr that ranks of ``call`` raised while
    ``remaining[0]`` others still run (once; cancel the timer when the call ends first)."""
    def tell() -> None:
        if remaining[0] > 0:
            print(f"monarch_nb: {call}: {_raised(dict(failures))} over {RAISED_NOTICE_S:g} s ago, and the call "
                  f"still waits for {remaining[0]} other rank(s). If they wait on the failed ones (a collective they "
                  "never join), they never answer: interrupt them (procs.interrupt(); %monarch interrupt), or, "
                  "blocked where an interrupt can't land (a gloo or NCCL wait), stop or restart their procs",
                  file=sys.stderr)

    timer = threading.Timer(RAISED_NOTICE_S, tell)
    timer.daemon = True
    timer.start()
    return timer


def _timeout_hint(mesh: "ActorMesh", endpoint: str, by_base: dict[int, int]) -> str:
    """For a call that timed out: that it still runs (a timeout only stops the waiting),
    how to stop it, and which of its actors are paused in the debugger."""
    return (f"; {mesh._name}.{endpoint} is still running on its actors, and their next calls wait behind it "
            f"(a later get() can still return its value): to stop it, call procs.interrupt() on its proc mesh "
            f"({mesh._proc_mesh_name!r}; in a notebook %monarch interrupt {mesh._name}), or mesh.stop()"
            + _paused_ranks_hint(mesh, by_base))


def _paused_ranks_hint(mesh: "ActorMesh", by_base: dict[int, int]) -> str:
    """For a call that timed out: which of its actors are paused in the debugger (one
    hub request, at most a second), or "" (none, or no hub to ask)."""
    try:
        stops = mesh._control().paused(timeout=1.0)
    except Exception:  # noqa: BLE001 - only a hint: the hub may be slow or gone
        return ""
    paused = sorted({s["rank"] for s in stops if s.get("mesh") == mesh._name and s.get("rank") in by_base})
    if not paused:
        return ""
    return (f"; {mesh._name} rank(s) {', '.join(map(str, paused))} are paused in the debugger "
            f"(%monarch debug, or cluster.debugger.paused({mesh._name!r}))")
