"""A host's router: takes one message per host for a call over a mesh that spans hosts,
delivers it to the actors of this host, and sends their replies back in batches.

It runs on a thread of its own in the host agent's process, with its own zmq context
and inbox: never on the agent's event loop, whose heartbeats tell the hub this host is
alive. A ``CAST`` (``protocol.router_ops``), verified (signature and replay stamp) like
every message, holds the call's header once and its arguments once; the router encodes
the call once, signed again, with itself as reply-to and the client's route
``(client address, port)`` as the port, and sends it to each local destination (a large
argument written to shared memory once for all of them, ``wire.shm.sharing``). The
actors verify it again, reply to the router, and the router sends what has arrived to
each client in one batch each time its inbox is drained (:class:`Casts`): replies
stream back as they complete, none held for the slowest. With a reducer the router
folds the values that succeeded into one reply per host, on a thread of its own
(``host.folds``: the reducer is the user's code, and must hold up nothing else);
without, replies that are byte for byte alike and come one after another (a train
step's ``None``) go as one naming their ranks, for a caller that asked (``COALESCE``).

Order: every call of a client to an actor of a routed mesh goes through this one
router, on one socket each way, so a caller's calls reach an actor in the order sent.
A client's port among a cast's arguments sends through this router too (the call
names it as ``VIA``; ``wire.port``): its values reach the client with the batches.
A Ctrl-C over a routed mesh comes as one ``INTERRUPT`` per host too: the router passes
it on to each local proc and answers once for them all (:class:`Relays`).

A router may also be a mesh's relay (``router_ops.RELAY``, for a client that set
``MONARCH_NB_ROUTER_RELAY=on``): the client's one cast per call names the other hosts'
destinations by their routers, and this router passes it on to each of them as
itself; they send that call's replies here (``UPSTREAM``, kept with the call), and they
go on to the client in this router's own batches, replies alike across hosts joined
into one. A client's port in such a call sends through the actor's router and this
relay (the relay is in the port's route). Since the client sends every routed call to a
mesh through that mesh's one relay, an actor's calls and replies (its port values too)
still take one path each way; a client's calls to two meshes may come through two.

A local proc that exits fails its pending calls here at once (a supervision failure),
without a round trip through the hub. A router that did not run for ``STALL_S`` (its
agent stopped, hung or starved) refuses the calls sent before it ran again: the hub may
have found the host lost meanwhile, and their callers been told they failed; delivered
late, a call reported failed would have run.

A fault of the router's own (a bug, an error from a library it calls: an error that one
message or one peer causes is handled there, and costs that message or peer only) makes
it start over, on the same inbox and with the same replay guard: every rank it still
awaits is answered with a ``SupervisionError`` saying the call may or may not have run,
its interrupts passed on are answered, and it goes on. Nothing is delivered twice (a
client never sends a call again by itself, and the guard still refuses what it has seen),
and nothing waits for ever on it; the host, its procs and their actors live on. A router
that faults more than ``RESTARTS_MAX`` times within ``RESTART_WINDOW_S`` makes its agent
leave: the hub loses the host, and supervision fails its calls. A router that dies takes
its agent's process along (it is a thread of it): that is the host lost too.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import zmq

from ..errors import ClusterError, SupervisionError
from ..protocol import envelope, proc_ops, router_ops
from ..wire import frames as wire_frames
from ..wire import shm, sockets
from . import folds
from .folds import FoldThread
from .replies import Entry, failure

POLL_MS = 50  # how long the router's poll waits (and how often it looks for exited procs)
DRAIN_MAX = 512  # replies taken in before a flush, when they keep coming
# Replies of a host's actors come in clumps (its procs share its cores): what arrives
# within GATHER_MS of the last goes in the same batch, none held past HOLD_MAX_S for
# others (a batch costs the client one receive and one signature check; bench_scale).
GATHER_MS = 1
HOLD_MAX_S = 0.002
# This thread did not run for this long (its agent stopped, hung or starved), beyond its
# waits: long enough that the hub may have found the host lost (hub.heartbeats: 3 s of
# silence, from a heartbeat up to 0.5 s before the stop) and clients failed its calls.
STALL_S = 2.0
# Replies up to this size are compared with the one queued before them, to be sent once
# with the ranks that gave it (router_ops.SAME); larger ones are rarely alike.
SAME_MAX_BYTES = 1024
# A relay holds its batches for replies still out on other hosts (as for its own) for
# at most this long after it passed a call on: a host lost meanwhile never answers.
RELAYED_FORGET_S = 60.0
# Faults of its own the router starts over from within a window before it gives up (its
# host is then lost): a fault that comes back at every turn must not loop for ever.
RESTARTS_MAX = 3
RESTART_WINDOW_S = 60.0
_PLAIN_REPLY = frozenset((envelope.OK, envelope.PORT, envelope.RANK))  # a reply with nothing but its value


# Where replies go: (the client's address, the relay they go through to it, or None:
# straight to it). A client's calls to two meshes may come through two relays.
Dest = tuple[str, "str | None"]


@dataclass
class _Cast:
    """A call's delivery on this host, until every destination answered."""

    port: Hashable  # the client's port
    waiting: dict[int, str]  # base rank -> proc id, of the destinations yet to answer
    reducer: bytes | None = None  # pickled (router_ops.REDUCE): its values are folded (host.folds)
    coalesce: bool = False  # identical replies go as one (router_ops.COALESCE)
    upstream: str | None = None  # the relay it came through (router_ops.UPSTREAM): its replies go back there


class Casts:
    """The calls in progress on this host and the replies ready to go back (pure logic,
    no sockets: the router's thread only). The values of a reduce are not folded here
    but given as jobs to fold (:meth:`take_folds`, for ``host.folds``)."""

    def __init__(self):
        self._open: dict[tuple[str, Hashable], _Cast] = {}  # (client address, port) -> its cast
        self._ready: dict[Dest, list[Entry]] = {}  # replies to send, in arrival order
        self._fold_jobs: list[tuple] = []  # for host.folds, in order
        # (client address, port) -> [replies still out on the other hosts of a call this
        # router relayed, monotonic time to stop counting them]
        self._relayed: dict[tuple[str, Hashable], list] = {}

    @property
    def waiting(self) -> bool:
        """Whether replies are still out (batches are held a little for them)."""
        return bool(self._open) or bool(self._relayed)

    def expect_relayed(self, route: tuple[str, Hashable], count: int, now: float) -> None:
        """``count`` replies for ``route`` are to come from the other hosts' routers (this
        router relayed the call): :attr:`waiting` until they did, or for
        ``RELAYED_FORGET_S``."""
        if count:
            self._relayed[route] = [count, now + RELAYED_FORGET_S]

    def forget_relayed(self, now: float) -> None:
        """Stop waiting for relayed replies past their time (a host lost meanwhile)."""
        for route, (_, until) in list(self._relayed.items()):
            if now >= until:
                del self._relayed[route]

    def open(self, route: tuple[str, Hashable], ranks: dict[int, str],
             reducer: bytes | None = None, coalesce: bool = False, upstream: str | None = None) -> None:
        """Expect one reply from each of ``ranks`` (base rank -> proc id) for the client
        route ``(address, port)``; with ``reducer`` (pickled), their values are to be
        folded; with ``coalesce``, a reply identical to the one queued just before it
        joins that one (``router_ops.SAME``) instead of going on its own; ``upstream``:
        the relay the call came through, which its replies go back through."""
        if ranks:
            self._open[route] = _Cast(route[1], dict(ranks), reducer, coalesce, upstream)

    def reply(self, route: tuple[str, Hashable], header: dict, body, buffers=(), upstream: str | None = None) -> None:
        """A local actor's reply for ``route``: queued for its client, or to fold. A
        port's value (not a reply awaited here) goes through ``upstream``, the relay its
        port names (``wire.port``)."""
        client, port = route
        cast = self._open.get(route)
        rank = header.get(envelope.RANK)
        header = {**header, envelope.PORT: port}
        if cast is None or rank not in cast.waiting:  # not (or no longer) a call here: a port's value
            self._queue((client, upstream), Entry(header, body, list(buffers)))
            return
        del cast.waiting[rank]
        dest = (client, cast.upstream)
        if cast.reducer is not None and header.get(envelope.OK):
            self._fold_jobs.append((folds.VALUE, (dest, port), cast.reducer, header, body, list(buffers)))
        elif cast.coalesce and not buffers and header.get(envelope.OK) and header.keys() <= _PLAIN_REPLY \
                and len(body) <= SAME_MAX_BYTES:
            self._queue_same(dest, Entry(header, body, same=bytes(body)))
        else:
            self._queue(dest, Entry(header, body, list(buffers)))
        self._close_if_done(route, cast)

    def fail_rank(self, route: tuple[str, Hashable], rank: int, error: BaseException, died: bool) -> None:
        """Answer ``rank`` of ``route`` with ``error`` (a send that failed, a proc gone)."""
        cast = self._open.get(route)
        if cast is None or cast.waiting.pop(rank, None) is None:
            return
        self._queue((route[0], cast.upstream), failure(cast.port, rank, error, died))
        self._close_if_done(route, cast)

    def abandon(self, error: BaseException) -> int:
        """Answer every rank still awaited with ``error`` (its actor lives: not ``DIED``),
        and stop holding batches for relayed replies: the router started over. Values
        already folded still go back (their reduce's end is given to fold). Returns how
        many ranks were answered."""
        answered = 0
        for route, cast in list(self._open.items()):
            for rank in list(cast.waiting):
                self.fail_rank(route, rank, error, died=False)
                answered += 1
        self._relayed.clear()
        return answered

    def proc_gone(self, gone: Callable[[str], str | None]) -> None:
        """Fail every pending rank whose proc ``gone(proc_id)`` says has exited (why)."""
        for route, cast in list(self._open.items()):
            for rank, proc_id in list(cast.waiting.items()):
                why = gone(proc_id)
                if why is not None:
                    self.fail_rank(route, rank, SupervisionError(why), died=True)

    def take(self) -> dict[Dest, list[Entry]]:
        """The replies ready, by destination, in arrival order; forgotten here."""
        ready, self._ready = self._ready, {}
        return ready

    def take_folds(self) -> list[tuple]:
        """The jobs to fold (``host.folds.Folds.run``) since the last take, in order."""
        jobs, self._fold_jobs = self._fold_jobs, []
        return jobs

    def queue(self, dest: Dest, entry: Entry) -> None:
        """Queue ``entry`` for ``dest`` (a reply made elsewhere: a fold)."""
        self._queue(dest, entry)

    def _close_if_done(self, route: tuple[str, Hashable], cast: _Cast) -> None:
        if cast.waiting:
            return
        del self._open[route]
        if cast.reducer is not None:
            self._fold_jobs.append((folds.DONE, ((route[0], cast.upstream), route[1])))

    def _queue(self, dest: Dest, entry: Entry) -> None:
        self._ready.setdefault(dest, []).append(entry)

    def _queue_same(self, dest: Dest, entry: Entry) -> None:
        """Queue ``entry``, or name its rank in the entry queued just before it for the
        same port when that one is byte for byte the same reply. Only the one just
        before: a reply joined to an earlier one would overtake what came between (a
        port's values that its actor sent before returning)."""
        if not self._join(dest, entry, [entry.header[envelope.RANK]]):
            entry.header[router_ops.SAME] = []  # (may be joined further on, at a relay: pass_on)
            self._queue(dest, entry)

    def pass_on(self, client: str, entry: Entry) -> None:
        """Queue ``entry``, a reply another host's router sent here for ``client`` (this
        router is that client's relay). One that router marked as one alike replies may
        join (``SAME``) joins the one queued just before it when byte for byte the same."""
        header = entry.header
        same = header.get(router_ops.SAME)
        expected = self._relayed.get((client, header.get(envelope.PORT)))
        if expected is not None:  # one reply naming the ranks it stands for (SAME, FOLDED) counts for each
            expected[0] -= len({header.get(envelope.RANK), *(same or ()), *(header.get(router_ops.FOLDED) or ())})
            if expected[0] <= 0:
                del self._relayed[(client, header.get(envelope.PORT))]
        if same is not None and not entry.buffers and header.get(envelope.OK) and len(entry.body) <= SAME_MAX_BYTES:
            entry.same = bytes(entry.body)
            if self._join((client, None), entry, [header[envelope.RANK], *same]):
                return
        self._queue((client, None), entry)

    def _join(self, dest: Dest, entry: Entry, ranks: list) -> bool:
        """Name ``ranks`` in the entry queued last for ``dest`` when it is ``entry``'s
        reply byte for byte, for the same port; whether it did."""
        queued = self._ready.get(dest)
        last = queued[-1] if queued else None
        if last is None or last.same != entry.same or last.header[envelope.PORT] != entry.header[envelope.PORT]:
            return False
        last.header.setdefault(router_ops.SAME, []).extend(ranks)
        return True


@dataclass
class _Relay:
    """An interrupt passed on to this host's procs, until each answered or ``deadline``."""

    client: tuple[str, Hashable]  # where the answer goes: (address, port)
    waiting: dict[int, str]  # index -> control address, of the procs yet to answer
    deadline: float  # monotonic
    missed: list[str] = field(default_factory=list)  # control addresses that could not be reached


class Relays:
    """The interrupts this router passed on to its procs, answered once for them all
    (pure logic, no sockets: the router's thread only). A proc's answer comes back to
    the router on port ``number`` naming its index as its rank."""

    def __init__(self):
        self._open: dict[int, _Relay] = {}
        self._numbers = itertools.count(1)

    @property
    def waiting(self) -> bool:
        return bool(self._open)

    def open(self, client: tuple[str, Hashable], addresses: list[str], wait_s: float, now: float) -> int:
        """Expect an answer from each of ``addresses``; returns the relay's number (the port
        the procs answer on)."""
        number = next(self._numbers)
        self._open[number] = _Relay(client, dict(enumerate(addresses)), now + wait_s)
        return number

    def give_up(self) -> None:
        """Make every relay due now, naming the procs that did not answer yet (the
        router started over: they may never have been asked)."""
        for relay in self._open.values():
            relay.deadline = 0.0

    def answered(self, number: int, index: int, reached: bool = True) -> None:
        """The proc of ``index`` answered relay ``number`` (``reached`` False: it can't be
        reached, and is named in the answer)."""
        relay = self._open.get(number)
        if relay is not None and index in relay.waiting:
            address = relay.waiting.pop(index)
            if not reached:
                relay.missed.append(address)

    def due(self, now: float) -> list[tuple[tuple[str, Hashable], list[str]]]:
        """The relays done (every proc answered) or past their deadline: (client, the
        control addresses that did not answer), each given once."""
        done = []
        for number, relay in list(self._open.items()):
            if not relay.waiting or now >= relay.deadline:
                del self._open[number]
                done.append((relay.client, sorted([*relay.missed, *relay.waiting.values()])))
        return done


def batch_frames(cluster_id: str, entries: list[Entry], relayed_for: str | None = None) -> list:
    """One signed frame set holding ``entries`` (none with buffers): their headers in
    ``BATCH``, their bodies one after another; ``relayed_for``: sent to a relay, for
    that client (``FOR``)."""
    bodies = [memoryview(e.body).cast("B") if not isinstance(e.body, bytes) else e.body for e in entries]
    header = {router_ops.BATCH: [e.header for e in entries], router_ops.LENGTHS: [len(b) for b in bodies]}
    if relayed_for is not None:
        header[router_ops.FOR] = relayed_for
    return wire_frames.encode(cluster_id, header, b"".join(bodies))


def unbatch(header: dict, body) -> list[tuple[dict, Any]]:
    """The ``(header, body)`` of each reply of a batch (bodies as views of ``body``)."""
    view = memoryview(body if body is not None else b"")
    out, at = [], 0
    for sub, length in zip(header[router_ops.BATCH], header[router_ops.LENGTHS]):
        out.append((sub, view[at:at + length]))
        at += length
    return out


class InjectedRouterFault(RuntimeError):
    """Raised on a router's thread when asked (``router_ops.INJECT_FAULT``): the fault
    ``monarch_nb.ft.inject_fault(mesh, "router")`` drills."""


class Router:
    """One host's router. :meth:`start` it; :meth:`stop` ends its thread.

    ``proc_exit(proc_id)``: why a proc of this host is gone (``None`` while it runs),
    asked from the router's thread while calls wait. ``on_failure(error)``: the thread
    ended on an error of its own, after starting over from ``RESTARTS_MAX`` within
    ``RESTART_WINDOW_S`` (the agent then leaves: the host is lost)."""

    def __init__(self, cluster_id: str, host_id: str, proc_exit: Callable[[str], str | None],
                 on_failure: Callable[[BaseException], None] | None = None):
        self.cluster_id = cluster_id
        self.host_id = host_id
        self._proc_exit = proc_exit
        self._on_failure = on_failure  # called on the router's thread with what ended it unasked
        self._ctx = sockets.sized(zmq.Context())  # its own: the agent's is an asyncio one, on the heartbeat loop
        self.inbox, self.address = sockets.bind_inbox(self._ctx)
        self.outbox = sockets.Outbox(self._ctx)
        self.guard = wire_frames.ReplayGuard()
        self.casts = Casts()
        self.casts_seen = 0  # CASTs delivered (for tests and benches)
        self.relays = Relays()
        # Routers of hosts the hub found lost (routers_lost): nothing goes through them as relays
        self._lost_routers: frozenset[str] = frozenset()
        # proc id -> the addresses of its actors this router sent calls to (proc_exited)
        self._actors_of: dict[str, set[str]] = {}
        self._actors_lock = threading.Lock()
        self.stalls = 0  # times this thread found it had not run for STALL_S (for tests)
        self.restarts = 0  # times it started over from a fault of its own (for tests)
        self._faulted_at: list[float] = []  # monotonic times of its faults within RESTART_WINDOW_S
        self._fault_asked = False  # router_ops.INJECT_FAULT came: raise InjectedRouterFault
        # monotonic and thread CPU time when it last looked (_note_running; its thread starts them again)
        self._ran_at, self._cpu_at = time.monotonic(), time.thread_time()
        self._stale_before = 0.0  # Unix time: casts stamped before it are refused (_note_running)
        self._folds = FoldThread(host_id)  # reduces' values folded off this thread (host.folds)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monarch-nb-router", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """End the router's thread and its folds' (waits up to ``timeout`` s for each)."""
        self._stopping.set()
        if self._thread.ident is not None:
            self._thread.join(timeout)
        else:  # never started: what its thread closes on its way out
            self.inbox.close(0)
            self._ctx.term()
        self._folds.stop(timeout)

    def proc_exited(self, proc_id: str) -> None:
        """(Any thread: the agent's, once it reaped the proc.) Close the sockets to the
        actors of proc ``proc_id`` and unlink the shared-memory segments of the calls
        queued to them that they never took (``Outbox.discard``): they held a large
        argument in ``/dev/shm`` until the host's next sweep, 5 to 20 s later."""
        with self._actors_lock:
            addresses = self._actors_of.pop(proc_id, ())
        for address in addresses:
            sockets.Outbox.discard(address)

    def routers_lost(self, routers) -> None:
        """(Any thread: the agent's, at each of the hub's heartbeats.) The routers of the
        hosts lost now. What this router has for a client through one of them as a relay
        (a port's values from live actors here, streamed on) goes straight to the client
        instead: sent to the dead relay, it was lost. The calls relayed through it have
        failed in the client (``router_ops.RELAY_LOST``); their late replies, sent
        straight, are dropped there."""
        self._lost_routers = frozenset(routers)

    # the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        self._ran_at, self._cpu_at = time.monotonic(), time.thread_time()
        try:
            poller = zmq.Poller()
            poller.register(self.inbox, zmq.POLLIN)
            poller.register(self._folds.wake_fd, zmq.POLLIN)  # folds done (host.folds)
            while not self._stopping.is_set():
                try:
                    self._turn(poller)
                except Exception as e:  # noqa: BLE001 - a fault of its own: start over, within limits
                    if not self._start_over(e):
                        raise
        except BaseException as e:  # a fault it can't start over from: the calls it carries would wait for nothing
            traceback.print_exc()
            if self._on_failure is not None:
                self._on_failure(e)
        finally:
            self.outbox.close_thread_sockets()
            self.inbox.close(0)
            self._ctx.term()

    def _turn(self, poller: zmq.Poller) -> None:
        """One turn of the thread: take in what came, pass on what is ready."""
        self._note_running()
        if self.inbox in dict(poller.poll(POLL_MS)):
            self._drain()
            self._gather_more()
        if self._fault_asked:
            self._fault_asked = False
            raise InjectedRouterFault(f"a fault injected in the router of host {self.host_id}")
        if self.casts.waiting:
            self.casts.proc_gone(self._proc_exit)
            self.casts.forget_relayed(time.monotonic())
        self._folds.submit(self.casts.take_folds())
        for dest, entry in self._folds.take():
            self.casts.queue(dest, entry)
        self._flush()
        if self.relays.waiting:
            self._answer_relays()
        sockets.sweep_idle()

    def _start_over(self, error: Exception) -> bool:
        """After a fault of its own: answer every rank awaited here with a failure (the
        call may or may not have run; its actor lives) and every interrupt passed on,
        then go on with the same inbox and replay guard. Whether it did: not past
        ``RESTARTS_MAX`` faults within ``RESTART_WINDOW_S``."""
        now = time.monotonic()
        self._faulted_at = [t for t in self._faulted_at if now - t < RESTART_WINDOW_S] + [now]
        self.relays.give_up()  # interrupts passed on are answered either way: their clients wait on them
        if len(self._faulted_at) > RESTARTS_MAX:
            print(f"monarch_nb router {self.host_id}: {len(self._faulted_at)} faults within {RESTART_WINDOW_S:.0f} s; "
                  "it gives up, and its host agent leaves", file=sys.stderr)
            with contextlib.suppress(Exception):  # (its calls fail as its host is lost)
                self._answer_relays()
            return False
        self.restarts += 1
        traceback.print_exc()
        why = f"{type(error).__name__}: {error}"
        answered = self.casts.abandon(SupervisionError(
            f"the router of host {self.host_id} failed ({why}) while this call was in flight, and started over: "
            "the call may or may not have run on this rank, whose actor lives on; call again if running it twice "
            "does no harm"))
        print(f"monarch_nb router {self.host_id}: failed ({why}); it starts over, and the calls in flight on this "
              f"host fail on their {answered} rank(s) here (fault {len(self._faulted_at)} of at most {RESTARTS_MAX} within "
              f"{RESTART_WINDOW_S:.0f} s before its host agent leaves)", file=sys.stderr)
        return True

    def _note_running(self) -> None:
        """Called as the thread turns and before each cast: time since the last call that
        is neither its CPU time nor its waits (at most a poll's, ``POLL_MS``) is time it
        did not run. Past ``STALL_S``, casts stamped before now are refused (:meth:`_cast`)."""
        now, cpu = time.monotonic(), time.thread_time()
        idle = (now - self._ran_at) - (cpu - self._cpu_at)
        self._ran_at, self._cpu_at = now, cpu
        if idle > STALL_S:
            self.stalls += 1
            self._stale_before = time.time()
            print(f"monarch_nb router {self.host_id}: did not run for {idle:.1f} s (its host agent stopped, hung "
                  "or starved); the calls sent meanwhile are refused, not run: their callers may have been "
                  "told the host was lost", file=sys.stderr)

    def _gather_more(self) -> None:
        """While calls still wait on replies, take in those that follow closely, up to
        ``HOLD_MAX_S`` after the first ready one."""
        deadline = time.monotonic() + HOLD_MAX_S
        while self.casts.waiting and time.monotonic() < deadline and self.inbox.poll(GATHER_MS):
            self._drain()

    def _drain(self) -> None:
        """Take in what is queued (a poll found some), at most ``DRAIN_MAX`` messages,
        asking whether more is (``sockets.queued``) rather than ending on a failed receive."""
        inbox = self.inbox
        for _ in range(DRAIN_MAX):
            try:
                frames = sockets.recv_frames(inbox, sockets.NOBLOCK)
            except zmq.Again:
                return
            try:
                self._handle(frames)
            except Exception as e:  # noqa: BLE001 - one bad message must not end the router
                wire_frames.count_dropped()
                print(f"monarch_nb router {self.host_id}: dropped a message ({type(e).__name__}: {e})",
                      file=sys.stderr)
            if not sockets.queued(inbox):
                return

    def _handle(self, frames: list) -> None:
        try:
            message = wire_frames.decode(frames, self.guard)
        except wire_frames.BadMessage:
            return  # unsigned, replayed, a chunk of a stream: dropped (and counted) by decode
        header = message.header
        op = header.get(envelope.OP)
        if op == router_ops.CAST:
            self._cast(message)
            return
        if op == router_ops.INTERRUPT:
            self._interrupt(header)
            return
        if op == router_ops.INJECT_FAULT:
            self._fault_asked = True  # raised between turns, with what came in this one in flight
            return
        if op == proc_ops.ACTOR_BOUND:
            self._actor_bound(header[proc_ops.ADDRESS], header[proc_ops.PROC])
            return
        client = header.get(router_ops.FOR)
        if client is not None:  # another router's replies for a client this one relays for
            if router_ops.BATCH in header:
                for sub, body in unbatch(header, message.body):
                    self.casts.pass_on(client, Entry(sub, body))
            else:
                lone = {k: v for k, v in header.items() if k != router_ops.FOR}
                self.casts.pass_on(client, Entry(lone, message.body if message.body is not None else b"",
                                                 list(message.buffers)))
            return
        route = header.get(envelope.PORT)
        if isinstance(route, int):  # a proc's answer to an interrupt passed on (or a late one)
            self.relays.answered(route, header.get(envelope.RANK, -1))
            return
        if not (isinstance(route, tuple) and len(route) in (2, 3)):
            raise ValueError(f"a message that is neither a cast nor a reply (header keys {sorted(header)})")
        # (client, port), or a port's (client, port, the relay it sends through: wire.port)
        self.casts.reply(route[:2], header, message.body if message.body is not None else b"", message.buffers,
                         upstream=route[2] if len(route) == 3 else None)

    def _actor_bound(self, address: str, proc_id: str) -> None:
        """A new actor of a routed mesh on this host is at ``address`` (told while its
        ``__init__`` runs: ``proc_ops.ANNOUNCE``): connect to it now, so that the mesh's
        first call does not wait for the handshakes of every actor of the host."""
        if not isinstance(address, str) or self._proc_exit(proc_id) is not None:
            return
        with self._actors_lock:
            self._actors_of.setdefault(proc_id, set()).add(address)
        self.outbox.connect([address], self.cluster_id.encode())

    def _cast(self, message: wire_frames.Message) -> None:
        header = message.header
        call = dict(header[router_ops.CALL])
        targets = header[router_ops.TARGETS]
        relay: dict = header.get(router_ops.RELAY) or {}
        self._note_running()
        if message.sent_at < self._stale_before:
            self._refuse_stale(call, header, [*targets, *itertools.chain.from_iterable(relay.values())],
                               message.sent_at)
            return
        client = header.get(router_ops.CLIENT)
        upstream = header.get(router_ops.UPSTREAM) or None
        if client:  # the client's ports among the arguments send through here, and its relay
            call[proc_ops.VIA] = [self.address, client, upstream] if upstream else [self.address, client]
        route = None
        if envelope.PORT in call:
            route = (call[envelope.REPLY], call[envelope.PORT])
        if relay:
            passed = self._relay(message, relay, route)
            if route is not None:
                self.casts.expect_relayed(route, passed, time.monotonic())
        if route is not None:
            call[envelope.REPLY], call[envelope.PORT] = self.address, route
            self.casts.open(route, {rank: proc for _, rank, proc in targets}, header.get(router_ops.REDUCE),
                            coalesce=bool(header.get(router_ops.COALESCE)), upstream=upstream)
        frames = wire_frames.encode(self.cluster_id, call, message.body, message.buffers, sign_at_send=True)
        self.casts_seen += 1
        with self._actors_lock:
            for address, _, proc_id in targets:
                self._actors_of.setdefault(proc_id, set()).add(address)
        with shm.sharing():  # large arguments written to shared memory once for the host's actors
            for address, rank, proc_id in targets:
                failed = self._deliver(address, proc_id, frames)
                if failed is not None and route is not None:
                    self.casts.fail_rank(route, rank, *failed)

    def _relay(self, message: wire_frames.Message, relay: dict, route: tuple[str, Hashable] | None) -> int:
        """Pass a client's cast on to the routers of ``relay`` (router address -> its
        targets), as this router, their replies to come back here (``UPSTREAM``). A
        router that can't be reached fails its targets' ranks of ``route`` (the caller's
        port; ``None``: nobody waits) here. Returns how many ranks it passed on."""
        header = message.header
        sub = {envelope.OP: router_ops.CAST, router_ops.CALL: header[router_ops.CALL],
               router_ops.CLIENT: header.get(router_ops.CLIENT), router_ops.UPSTREAM: self.address}
        for key in (router_ops.REDUCE, router_ops.COALESCE):
            if key in header:
                sub[key] = header[key]
        passed = 0
        for router, targets in relay.items():
            sub[router_ops.TARGETS] = targets
            try:
                self.outbox.send(router, wire_frames.encode(self.cluster_id, sub, message.body, message.buffers,
                                                            sign_at_send=True), wait=False)
                passed += len(targets)
            except Exception as e:  # noqa: BLE001 - gone, refused, or a socket it can't make (out of files)
                if route is not None:
                    self.casts.open(route, {rank: proc for _, rank, proc in targets},
                                    coalesce=bool(header.get(router_ops.COALESCE)))
                    for _, rank, _ in targets:
                        self.casts.fail_rank(route, rank, SupervisionError(
                            f"the router {router} of its host could not be reached from the relay on host "
                            f"{self.host_id}: {e}"), died=True)
        return passed

    def _refuse_stale(self, call: dict, header: dict, targets: list, sent_at: float) -> None:
        """Answer each target of a cast sent before this router's stall with a failure,
        not delivering it (a broadcast, unanswered, is dropped)."""
        if envelope.PORT not in call:
            return
        route = (call[envelope.REPLY], call[envelope.PORT])
        error = SupervisionError(
            f"host {self.host_id} did not relay this call: its router did not run for a while (its host agent "
            f"stopped, hung or starved) and the call, sent {time.time() - sent_at:.1f} s ago, was refused rather "
            f"than run late, since the hub may have found the host lost meanwhile; it was not run")
        self.casts.open(route, {rank: proc for _, rank, proc in targets},
                        coalesce=bool(header.get(router_ops.COALESCE)), upstream=header.get(router_ops.UPSTREAM) or None)
        for _, rank, _ in targets:
            self.casts.fail_rank(route, rank, error, died=True)

    def _deliver(self, address: str, proc_id: str, frames: list) -> tuple[BaseException, bool] | None:
        """Send a call to the local actor at ``address`` of proc ``proc_id``; returns the
        error that fails it instead, and whether that says its actor is gone. Nothing
        goes to a proc known gone, and a send to one found gone just after is let go
        (:meth:`proc_exited` may have run before it): either would keep its large
        arguments in shared memory until the host's sweep."""
        why = self._proc_exit(proc_id)
        if why is not None:
            return SupervisionError(why), True
        try:
            self.outbox.send(address, frames, wait=False)
        except ClusterError as e:  # the actor refused it, or is gone
            return e, True
        except Exception as e:  # noqa: BLE001 - this router's own trouble (a socket it can't make: out of files)
            return SupervisionError(f"the router of host {self.host_id} could not send this call to its actor "
                                    f"({type(e).__name__}: {e}); it was not run"), False
        if self._proc_exit(proc_id) is not None:
            sockets.Outbox.discard(address)  # (the call fails through Casts.proc_gone)
        return None

    def _interrupt(self, header: dict) -> None:
        """Pass a client's interrupt on to each proc it names; answered by ``_answer_relays``."""
        procs = header[router_ops.PROCS]
        wait_s = min(float(header.get(router_ops.TIMEOUT) or router_ops.INTERRUPT_WAIT_MAX_S),
                     router_ops.INTERRUPT_WAIT_MAX_S)  # (no timeout: at most the longest)
        number = self.relays.open((header[envelope.REPLY], header[envelope.PORT]),
                                  [address for address, _ in procs], wait_s, time.monotonic())
        for index, (address, routes) in enumerate(procs):
            request = {envelope.OP: proc_ops.INTERRUPT, proc_ops.MESH: header[proc_ops.MESH],
                       proc_ops.ROUTES: routes, envelope.REPLY: self.address, envelope.PORT: number,
                       envelope.RANK: index}
            try:
                self.outbox.send(address, wire_frames.encode(self.cluster_id, request), wait=False)
            except Exception:  # noqa: BLE001 - gone, refused, or a socket it can't make: named in the answer
                self.relays.answered(number, index, reached=False)
        self._answer_relays()

    def _answer_relays(self) -> None:
        for (client, port), missed in self.relays.due(time.monotonic()):
            self._send(client, wire_frames.encode(self.cluster_id, {envelope.PORT: port, envelope.RANK: 0,
                                                                    envelope.OK: True, router_ops.MISSED: missed}))

    def _flush(self) -> None:
        lost = self._lost_routers
        for (client, upstream), entries in self.casts.take().items():  # upstream: its relay, or None
            if upstream in lost:
                upstream = None
            small: list[Entry] = []
            for entry in entries:  # in arrival order: one with buffers goes alone, after those before it
                if not entry.buffers:
                    small.append(entry)
                    continue
                self._send_batch(client, upstream, small)
                small = []
                header = entry.header if upstream is None else {**entry.header, router_ops.FOR: client}
                self._send(upstream or client, wire_frames.encode(self.cluster_id, header, entry.body,
                                                                  entry.buffers, sign_at_send=True))
            self._send_batch(client, upstream, small)

    def _send_batch(self, client: str, upstream: str | None, entries: list[Entry]) -> None:
        if entries:
            frames = batch_frames(self.cluster_id, entries, relayed_for=client if upstream else None)
            self._send(upstream or client, frames)

    def _send(self, client: str, frames: list) -> None:
        try:
            self.outbox.send(client, frames, wait=False)
        except Exception as e:  # noqa: BLE001 - the client is gone (its replies with it), or a socket it can't make
            print(f"monarch_nb router {self.host_id}: replies to {client} dropped: {e}", file=sys.stderr)

