"""The message loop of an actor whose endpoints are ``async def``: its own asyncio event
loop, on the actor's thread, reading the actor's inbox.

Calls are taken in arrival order and, as in Monarch, run one at a time: the next call
starts when the previous one has returned, even while it awaits. A call of a
``@concurrent_endpoint`` starts as a task when its turn comes and the next message is
taken at once, so such calls interleave at their awaits (e.g. an actor's endpoint that
awaits a call to a mesh which calls it back). A supervision message (a mesh this
actor owns failed) is handled as it arrives, also while a call awaits, so
``__supervise__`` runs while the endpoint that spawned the failed mesh is waiting on
it; calls taken after it wait until it has returned. A stop cancels the calls in
progress (their callers hear that the actor was stopped), refuses those still queued,
and ends the loop.

Interrupts land only in the actor's code, as for a thread actor (``actor_loop``): each
step of a call's coroutine runs with the actor's gate open, between steps the loop's
own code runs with it closed. An interrupt that comes while the loop waits (every call
awaiting) is thrown into the calls in progress as ``KeyboardInterrupt`` instead.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import sys
import time
import traceback

import zmq

from ..errors import MeshFailure
from ..mesh import Point
from ..protocol import envelope, proc_ops
from ..wire import frames as wire_frames
from ..wire import sockets, stream
from . import call_chain
from .actor import is_concurrent, set_message_rank
from .stdio import set_call_origin

_EVENTS, _POLLIN = sockets.EVENTS, sockets.POLLIN
STOP_CANCEL_S = 5.0  # how long a stop waits for cancelled calls to unwind before ending the loop


class _Call:
    """One call in progress: its task, and whether an interrupt asked to end it."""

    __slots__ = ("task", "interrupted")

    def __init__(self):
        self.task: asyncio.Task | None = None
        self.interrupted = False


class _Stepped:
    """Awaitable driving coroutine ``coro`` one step at a time through the actor's
    ``_call_user`` (gate open, never raising): ``await`` gives ``(result, error)``.
    A cancellation of its task is thrown into ``coro`` as ``KeyboardInterrupt`` when
    the call was interrupted, as ``CancelledError`` otherwise."""

    def __init__(self, actor, coro, call: _Call, origin: str | None, name: str, chain: call_chain.Chain = (),
                 message_rank: Point | None = None):
        self._actor, self._coro, self._call, self._origin, self._name = actor, coro, call, origin, name
        self._chain, self._message_rank = chain, message_rank

    def __await__(self):
        actor, coro = self._actor, self._coro
        value, thrown = None, None
        while True:
            set_call_origin(self._origin)  # calls interleave: each step prints for its own caller
            call_chain.set_chain(self._chain)  # ... and calls on for its own chain
            set_message_rank(self._message_rank)  # ... at its own message_rank
            if thrown is None:
                yielded, error = actor._call_user(actor.step_endpoint, coro.send, value, self._name)
            else:
                yielded, error = actor._call_user(actor.step_endpoint, coro.throw, thrown, self._name)
            set_call_origin(None)
            call_chain.set_chain(None)
            set_message_rank(None)
            if error is not None:
                if isinstance(error, StopIteration):
                    return error.value, None
                return None, error
            try:
                value, thrown = (yield yielded), None
            except asyncio.CancelledError as e:
                value, thrown = None, e
                if self._call.interrupted:  # not a cancellation: the task goes on
                    self._call.interrupted = False
                    asyncio.current_task().uncancel()
                    thrown = KeyboardInterrupt()
            except BaseException as e:  # noqa: BLE001 - handed to the coroutine, as a Task would
                value, thrown = None, e


class AsyncServer:
    """Serves one async actor's inbox on an event loop of the actor's thread."""

    def __init__(self, actor, inbox: zmq.Socket, instance):
        self.actor = actor
        self.inbox = inbox
        self.instance = instance
        self.guard = wire_frames.ReplayGuard()
        self.queue: collections.deque = collections.deque()  # (message, reply_to) calls not yet started
        self.calls: set[_Call] = set()
        self._supervising: set[asyncio.Task] = set()  # async __supervise__ calls in progress
        self.loop = asyncio.new_event_loop()
        self._queued = asyncio.Event()
        self._stopped: asyncio.Future | None = None  # set with the stop message's reply_to
        self._drained_at = time.monotonic()  # when a message was last read, or idle time last counted
        self._idle_check: asyncio.TimerHandle | None = None

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.loop.close()

    def interrupt(self) -> None:
        """From another thread: throw ``KeyboardInterrupt`` into the calls in progress
        (a stop's interrupt cancels them instead)."""
        def deliver() -> None:
            for call in list(self.calls):
                if call.task is not None and not call.task.done():
                    call.interrupted = not self.actor.stopping
                    call.task.cancel()

        self.loop.call_soon_threadsafe(deliver)

    async def _main(self) -> None:
        self._stopped = self.loop.create_future()
        fd = self.inbox.getsockopt(zmq.FD)
        self.loop.add_reader(fd, self._readable)
        serial = self.loop.create_task(self._serve_in_order())
        self._readable()  # what arrived before the reader was added
        self._idle_check = self.loop.call_later(stream.IDLE_CHECK_S, self._count_idle)
        try:
            reply_to = await self._stopped
        finally:
            self.loop.remove_reader(fd)
            self._idle_check.cancel()
        await self._shut_down(serial)
        actor = self.actor
        cleanup = actor.cleanup_hook(self.instance)
        if cleanup is not None:
            coro, error = actor._call_user(cleanup, None)
            if error is None and asyncio.iscoroutine(coro):
                _, error = await _Stepped(actor, coro, _Call(), None, "__cleanup__")
            actor.cleaned_up(error)
        actor.stopped(reply_to)

    def _count_idle(self) -> None:
        """Every ``IDLE_CHECK_S`` while half-received streams are open: once what waits in
        the inbox is read, the time since a message last came (or this last counted) was
        spent waiting for nothing, and counts toward dropping a dead sender's stream
        (``wire.stream``; a blocking inbox counts it in ``sockets.recv_frames``; this loop
        never blocks there)."""
        streams = self.guard.streams
        if streams:
            self._readable()  # what waits is read first: a chunk keeps its stream
            now = time.monotonic()
            streams.idle(now - self._drained_at)
            self._drained_at = now
        self._idle_check = self.loop.call_later(stream.IDLE_CHECK_S, self._count_idle)

    def _readable(self) -> None:
        """Take every message queued at the inbox (its descriptor is edge-triggered)."""
        inbox = self.inbox
        self._take_failures()
        while not self._stopped.done() and inbox.getsockopt(_EVENTS) & _POLLIN:
            self._drained_at = time.monotonic()
            try:
                message = wire_frames.decode(sockets.recv_frames(inbox, sockets.NOBLOCK), self.guard)
            except wire_frames.BadMessage:
                continue
            try:
                self._take_failures()  # queued by the proc before this message came
                self._accept(message)
            except BaseException:  # noqa: BLE001 - a bad message must not end the actor
                wire_frames.count_dropped()
                print(f"monarch_nb: actor {self.actor.mesh_name}/{self.actor.point.rank} dropped a message "
                      "it could not handle:", file=sys.stderr)
                traceback.print_exc()

    def _accept(self, message: wire_frames.Message) -> None:
        header = message.header
        reply_to = (header[envelope.REPLY], header[envelope.PORT]) if envelope.PORT in header else None
        kind = header[envelope.KIND]
        if kind == proc_ops.CALL:
            if proc_ops.ENDPOINT not in header:
                raise KeyError(f"a call without {proc_ops.ENDPOINT!r}")  # a bad message, dropped now
            self.queue.append((message, reply_to))
            self._queued.set()
        elif kind == proc_ops.SUPERVISE:  # now, even while a call awaits
            self._supervise_now(header[proc_ops.FAILURE], reply_to)
        elif kind == proc_ops.WAKE:
            pass  # its failures were taken above
        elif kind == proc_ops.CONNECT:
            self.actor.connect_to(header.get(proc_ops.CALLER))
        elif kind == proc_ops.STOP:
            self._stopped.set_result(reply_to)
        else:
            raise ValueError(f"unknown message kind {kind!r}")

    def _take_failures(self) -> None:
        """The failures the proc queued for this actor (``ActorThread.queue_failure``)."""
        failures = self.actor.failures
        while failures:
            failure, verdict_to = failures.popleft()
            self._supervise_now(failure, verdict_to)

    def _supervise_now(self, failure: dict, reply_to) -> None:
        """``__supervise__(failure)``: a sync one runs now; an ``async`` one starts as a
        task, which the calls taken after it wait for."""
        if inspect.iscoroutinefunction(getattr(self.instance, "__supervise__", None)):
            task = self._start(self._supervise(failure, reply_to)).task
            self._supervising.add(task)
            task.add_done_callback(self._supervising.discard)
        else:
            self.actor._supervise(self.instance, failure, reply_to)

    async def _serve_in_order(self) -> None:
        while True:
            while not self.queue:
                self._queued.clear()
                await self._queued.wait()
            message, reply_to = self.queue.popleft()
            self._take_failures()  # queued while this call waited its turn
            if self._supervising:
                # It starts after the __supervise__ calls begun before it have returned, as
                # after a sync one: it sees what they recorded (Monarch's order).
                await asyncio.wait(list(self._supervising))
            name = message.header[proc_ops.ENDPOINT]
            if is_concurrent(getattr(self.instance, name, None)):
                self._start(functools.partial(self._run, message=message, name=name, reply_to=reply_to))
            else:
                call = _Call()
                run = self._run(call, message, name, reply_to)
                call.task = asyncio.current_task()
                self.calls.add(call)
                try:
                    await run
                finally:
                    self.calls.discard(call)
                if self._stopped.done():  # the stop's cancellation went to that call
                    return

    def _start(self, run) -> _Call:
        """Run ``run(call)`` as a task of this loop, among the calls a stop cancels."""
        call = _Call()
        call.task = self.loop.create_task(run(call))
        self.calls.add(call)
        call.task.add_done_callback(lambda _: self.calls.discard(call))
        return call

    def _supervise(self, failure: dict, reply_to):
        """An ``async def __supervise__``, awaited on this loop like an endpoint."""
        async def run(call: _Call) -> None:
            actor = self.actor
            if actor.dead is not None:
                actor.supervised(False, None, reply_to, failure)
                return
            coro, error = actor._call_user(self.instance.__supervise__, MeshFailure.from_event(failure))
            verdict = None
            if error is None:
                verdict, error = await _Stepped(actor, coro, call, None, "__supervise__")
            actor.supervised(verdict, error, reply_to, failure)

        return run

    async def _run(self, call: _Call, message: wire_frames.Message, name: str, reply_to) -> None:
        actor = self.actor
        if actor.dead is not None or actor.stopping:
            actor._call(self.instance, message, reply_to)  # refused: dead, or stopped
            return
        prepared = actor.prepare(self.instance, name, message, reply_to)
        if isinstance(prepared, BaseException):
            actor.finish(name, None, prepared, reply_to, explicit=False)
            return
        method, args, kwargs, explicit = prepared
        origin = message.header.get(proc_ops.ORIGIN)
        chain = actor.chain(message, holds=not is_concurrent(method))
        message_rank = actor.message_rank_of(message.header)
        actor.begin(name)
        try:
            call_chain.set_chain(chain)  # a plain ``def`` endpoint runs whole in this first step
            set_message_rank(message_rank)
            try:
                result, error = actor._call_user(method, *args, **kwargs)
            finally:
                call_chain.set_chain(None)
                set_message_rank(None)
            if error is None and asyncio.iscoroutine(result):
                result, error = await _Stepped(actor, result, call, origin, name, chain, message_rank)
        finally:
            actor.end()
        if actor.stopping and isinstance(error, asyncio.CancelledError):  # not a fault: no actor dies of it
            error, explicit = RuntimeError(f"actor mesh {actor.mesh_name} was stopped while this call ran"), False
        actor.finish(name, result, error, reply_to, explicit)

    async def _shut_down(self, serial: asyncio.Task) -> None:
        """Cancel the calls in progress, refuse the queued ones."""
        self.actor.stopping = True
        tasks = [serial, *(c.task for c in self.calls if c.task is not None)]
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=STOP_CANCEL_S)
        while self.queue:
            message, reply_to = self.queue.popleft()
            self.actor._call(self.instance, message, reply_to)
