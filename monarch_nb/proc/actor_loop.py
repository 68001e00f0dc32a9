"""One actor's message loop: its own thread, its own inbox socket.

Messages to an actor go straight to its socket (no hand-off through the proc), and
are handled one at a time in arrival order. An actor whose endpoints are ``async def``
serves its inbox on its own event loop instead (``async_actor``: concurrent endpoints,
``__supervise__`` while a call awaits). Replies go straight to the caller's mailbox.

Interrupts (``%monarch interrupt``, Ctrl-C in the notebook) land only in the actor's
own code: its ``__init__`` and its endpoints. Each actor holds a *gate* lock while it
runs the runtime's code and opens it only around user code; the interrupter injects
``KeyboardInterrupt`` only while it holds the open gate and the actor's stack allows it
(``wire.interrupts``: user code may call back into the runtime, e.g. to call another
mesh). An injected interrupt lands at the actor's next bytecode, at the latest right
after it takes the gate back, which is still inside the ``try`` that catches it. A
message the loop can't act on (a header missing a key) is dropped and counted; no
failure ends the actor's thread except a stop.

An actor *dies* (Monarch's supervision) when an endpoint raises a ``BaseException``
that is not an ``Exception`` (``SystemExit``, ``asyncio.CancelledError``, ...; not the
``KeyboardInterrupt`` of an interrupt, which only fails its call); when an endpoint
called with ``broadcast`` raises (nobody to answer to), unless its class says
``survive_broadcast_errors``; when its ``__supervise__`` does not handle a failure of a
mesh it owns, unless its class says ``survive_unhandled_children``; or, when the spawn
asks for it (``INIT_FAULT``), when its ``__init__`` raises. A dead actor keeps its
inbox until stopped and answers every call with a supervision failure, also a call
that was running as it died; the hub is told first (``ACTOR_FAILED`` with ``DEAD``) and
tells the mesh's owner and the clients. The actor answers its callers only once the hub
has answered that report, i.e. once the owner's proc has queued the failure for the owner
(``queue_failure``): the owner's ``__supervise__`` takes it before any message it takes
after that, so before any call sent to it once a caller saw the error (Monarch's order).
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import dataclasses
import inspect
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable

import zmq

from ..errors import MeshFailure, SupervisionError, actor_gone_report, actor_name
from ..mesh import Point, Shape
from ..protocol import envelope, hub_ops, proc_ops
from ..protocol.states import STATE, Activity
from ..wire import frames as wire_frames
from ..wire import interrupts, sockets
from ..wire import port as wire_port
from ..wire.remote_error import pack_exception
from . import activity, call_chain, forked_child
from .actor import (Actor, ActorInstance, Context, _set_current, actor_ended, endpoint_names, is_endpoint,
                    set_message_rank, takes_port)
from .async_actor import AsyncServer
from .stdio import end_of_call, set_call_origin


# Return values that can't be awaitable (most are these): not asked, since
# inspect.isawaitable's ABC check costs more than the rest of the reply's bookkeeping.
_NEVER_AWAITED = frozenset((type(None), bool, int, float, str, bytes, dict, list, tuple))
CANCELLED_KEPT = 4096  # interrupted calls remembered per actor (a call comes at most once)
_VIEWS_KEPT = 64  # views (meshes and slices called) whose point an actor keeps
# How long a dying actor waits for the hub to answer its report before answering its
# callers (the hub answers in milliseconds; only a stalled or dead hub makes it wait).
REPORT_WAIT_S = 2.0


def send_reply(outbox: sockets.Outbox, cluster_id: str, reply_to: tuple[str, int] | None,
               rank: int, value=None, error: BaseException | None = None, what: str = "return value",
               extra: dict | None = None) -> None:
    """Send ``value`` (or ``error``) to ``reply_to = (address, port)``; no-op without one
    (``wire.port.deliver``)."""
    if reply_to is not None:
        wire_port.deliver(outbox, cluster_id, *reply_to, rank, value, error, what, extra)


def _landing() -> None:
    """An interrupt injected while user code ran lands here at the latest (a call is
    a point where Python checks for one)."""


class ActorThread:
    """Runs one actor: constructs it, then serves its inbox until stopped."""

    def __init__(self, cluster_id: str, mesh_name: str, point: Point, proc_id: str,
                 spawn: wire_frames.Message, reply_to: tuple[str, int], outbox: sockets.Outbox,
                 main_thread: bool = False, hub: str | None = None,
                 on_endpoint_error: Callable[[BaseException, str], None] | None = None,
                 proc_status: Callable[[], dict] | None = None):
        self.cluster_id = cluster_id
        self.mesh_name = mesh_name
        self.point = point
        self.outbox = outbox
        self.hub = hub  # where failures nobody can be told of go (None: this_proc, no hub)
        # Called in this thread with (exception, endpoint) when an endpoint raises, before
        # the error is replied (the proc's hooks: the debugger's post-mortem).
        self._on_endpoint_error = on_endpoint_error
        # The proc's status (ProcServer.status), sent with the answer to the spawn: the hub
        # then knows what the new actor does (idle) without asking every proc again.
        self._proc_status = proc_status
        self._view_points: dict = {}  # proc_ops.VIEW -> this actor's point there (message_rank_of)
        # message kind -> handler(instance, message, reply_to); one returning STOP ends the loop
        self._kinds: dict[str, Callable] = {
            proc_ops.CALL: self._call, proc_ops.SUPERVISE: self._supervise_message, proc_ops.STOP: self._stop,
            proc_ops.WAKE: lambda instance, message, reply_to: None,  # (the failures it is for are taken first)
            proc_ops.CONNECT: lambda instance, message, reply_to: self.connect_to(message.header.get(proc_ops.CALLER))}
        # Failures of meshes it owns, queued by its proc (queue_failure): (failure, verdict route)
        self.failures: collections.deque = collections.deque()
        self._spawn = spawn
        self._reply_to = reply_to
        self._instance_info = ActorInstance(mesh_name, point, proc_id, os.getpid())
        self._lineage = forked_child.lineage()  # a process forked after this is not this actor
        self._loop: asyncio.AbstractEventLoop | None = None  # a sync actor's, for awaitables its endpoints return
        self._async: AsyncServer | None = None  # an async actor's message loop
        self._has_cleanup = False
        self._survives: type[Actor] = Actor  # its class, for the supervision options (Actor: Monarch's rules)
        self.address: str | None = None
        self._own_chain: call_chain.Chain | None = None  # this actor alone (made once its address is known)
        self.busy = False  # handling a message (an interrupt is delivered only then)
        self._running = 0  # calls in progress (several for an async actor's concurrent endpoints)
        self.calls = 0  # endpoint calls begun: tells an interrupt meant for one call from the next
        # The synchronous call running now: (its number in ``calls``, its reply route), or None.
        self.running_call: tuple[int, tuple[str, int] | None] | None = None
        # Reply routes of calls their caller interrupted (Ctrl-C), maybe before they began:
        # such a call is refused when it comes. Bounded: the oldest are forgotten.
        self._cancelled: dict[tuple[str, int], None] = {}
        self.stopping = False  # set by the proc's stop: calls still queued are refused, not run
        # Set as this proc ends, before the user's modules are finalized: a call still
        # running then is not answered (its caller hears of the proc's end, as of a
        # SIGKILL), rather than with what the finalized globals made it raise.
        self.proc_ending = False
        self.finished = threading.Event()  # its loop has ended (the thread is done with user code)
        # Held by the actor's thread except while user code runs: see the module docstring.
        self._gate = threading.Lock()
        self._gate.acquire()
        self.current: tuple[str, float] | None = None  # endpoint running, since (wall clock, s)
        self.dead: str | None = None  # why this actor died: every later call fails with it
        self.actor_class: type | None = None  # once constructed (the debugger binds breakpoints to its code)
        self.instance: object | None = None  # once constructed
        # An actor on the proc's main thread (``%%monarch exec``) can be interrupted even
        # in a blocking call such as time.sleep: SIGINT interrupts the main thread only.
        self.thread = (threading.main_thread() if main_thread else
                       threading.Thread(target=self._run, name=f"actor-{mesh_name}-{point.rank}", daemon=True))

    @property
    def is_async(self) -> bool:
        """Its endpoints are ``async def``: it serves its inbox on its own event loop."""
        return self._async is not None

    @property
    def has_cleanup(self) -> bool:
        """It defines Monarch's ``__cleanup__``: a stop must reach it before its proc exits."""
        return self._has_cleanup

    @property
    def on_main_thread(self) -> bool:
        return self.thread is threading.main_thread()

    def start(self) -> None:
        """Run the actor on its own thread (one on the main thread is run by the proc)."""
        if not self.on_main_thread:
            self.thread.start()

    def run(self) -> None:
        self._run()

    def interrupt_thread(self, exception: type[BaseException] = KeyboardInterrupt) -> bool:
        """Raise ``exception`` (``KeyboardInterrupt``, or an injected fault: ``proc.faults``)
        in the user code this thread actor is running, if it is running some now. It
        lands at the next Python bytecode: a blocking C call finishes first. False when
        the actor is not in user code at this instant (the caller may try again), and
        for anything but ``KeyboardInterrupt`` into an ``async`` actor. True, and dropped,
        for a thread paused in the debugger (``wire.interrupts.refusing``)."""
        ident = self.thread.ident
        if self.on_main_thread or ident is None:
            return False
        if interrupts.refuses(sys._current_frames().get(ident)):
            return True  # paused in the debugger: dropped, and not tried again (wire.interrupts.refusing)
        if self._async is not None and exception is not KeyboardInterrupt:
            return False
        if self._async is not None and (self.stopping or not self._gate.acquire(blocking=False)):
            # An async actor's calls are awaiting: thrown into them on its loop. A stop
            # only cancels them, and must not interrupt the code handling the cancellation.
            if self.busy:
                self._async.interrupt()
            return self.busy
        if self._async is None and not self._gate.acquire(blocking=False):
            return False
        try:
            if not interrupts.allows(sys._current_frames().get(ident)):
                return False  # user code called into the runtime (e.g. another mesh's get())
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exception))
            return True
        finally:
            self._gate.release()

    def cancel(self, route: tuple[str, int]) -> int | None:
        """The caller waiting on ``route`` gave up (Ctrl-C): refuse that call if it has
        not begun; if it is running now, return its number (to interrupt it)."""
        self._cancelled[route] = None  # first: a call beginning now sees it, or is seen below
        while len(self._cancelled) > CANCELLED_KEPT:
            del self._cancelled[next(iter(self._cancelled))]
        running = self.running_call
        return running[0] if running is not None and running[1] == route else None

    def cancelled(self, route: tuple[str, int] | None) -> bool:
        return route is not None and route in self._cancelled

    def in_user_code(self, frame) -> bool:
        """For the main-thread actor, in its own SIGINT handler: whether ``frame`` (where
        the signal arrived) is user code the interrupt may land in."""
        return not self._gate.locked() and interrupts.allows(frame)

    @interrupts.checkpoint
    def _call_user(self, fn: Callable, *args, **kwargs) -> tuple[Any, BaseException | None]:
        """``fn(*args, **kwargs)`` with the gate open; returns ``(result, None)`` or
        ``(None, the exception)``. Never raises."""
        gate = self._gate
        try:
            gate.release()
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:
                self._leave_if_forked(e)
                raise
            else:
                self._leave_if_forked(None)
            finally:
                gate.acquire()
                _landing()
            return result, None
        except BaseException as e:  # noqa: BLE001 - the caller reports it
            return None, e

    def forked_child(self) -> bool:
        """Whether this is a child process that this actor's code forked (in which the
        actor's thread is a copy that must never speak for the actor)."""
        return forked_child.is_child(self._lineage)

    def _leave_if_forked(self, error: BaseException | None, suspended: bool = False) -> None:
        """In a child that this actor's code forked, leaving that code (``error``: how;
        ``None``: it returned) ends the child (``proc.forked_child``): no reply, no
        failure report, no inbox read for its parent. A no-op in the actor's process."""
        if forked_child.is_child(self._lineage):
            forked_child.leave(error, f"{self.mesh_name}[{self.point.rank}]", suspended)

    def status(self) -> dict:
        """``state`` idle, busy (``endpoint``, ``since``) or paused (where, since)."""
        stop = activity.paused(self.thread.ident)
        if stop is not None:
            return {STATE: Activity.PAUSED, **stop}
        current = self.current
        if current is None:
            return {STATE: Activity.IDLE}
        return {STATE: Activity.BUSY, "endpoint": current[0], "since": current[1]}

    def _context(self) -> Context:
        return Context(self._instance_info, self.point)

    def _run(self) -> None:
        # Its ports' values leave on the sockets its replies take, in order with them, signed
        # for its cluster (a client's this_proc() actors: the client holds other clusters).
        wire_port.bind_actor_thread(self.outbox, self.cluster_id)
        try:
            self._construct_and_serve()
        finally:
            actor_ended(self._instance_info.actor_id)  # e.g. the RDMA buffers it registered are released
            self.finished.set()

    def _construct_and_serve(self) -> None:
        # A restarted actor takes its predecessor's address when free: handles keep working.
        inbox, self.address = sockets.bind_inbox(prefer=self._spawn.header.get(proc_ops.PREFER))
        caller = self._spawn.header.get(proc_ops.CALLER)
        self.connect_to(caller)  # the spawner (or the host's router), while __init__ runs
        self._announce(caller, self._spawn.header.get(proc_ops.ANNOUNCE))
        self._instance_info = dataclasses.replace(self._instance_info, address=self.address)
        _set_current(self._context())
        set_call_origin(self._spawn.header.get(proc_ops.ORIGIN))  # what __init__ prints goes to the spawner
        try:
            cls, args, kwargs = self._spawn.value()
        except BaseException as e:  # noqa: BLE001 - e.g. the class can't be imported here
            instance, error = None, e
        else:
            if isinstance(cls, type) and issubclass(cls, Actor):
                self._instance_info = dataclasses.replace(self._instance_info,
                                                          class_name=f"{cls.__module__}.{cls.__qualname__}")
                _set_current(self._context())
                self.current = ("__init__", time.time())
                self.busy = True
                instance, error = self._call_user(cls, *args, **kwargs)
                self.actor_class = cls
                self.busy = False
                self.current = None
            else:
                instance, error = None, TypeError(f"{cls!r} is not an Actor subclass")
        init_fault = self._spawn.header.get(proc_ops.INIT_FAULT, False)
        self._spawn = None  # drop the class/argument buffers
        set_call_origin(None)
        if error is None:
            extra = {proc_ops.ADDRESS: self.address}
            if self._proc_status is not None:
                extra[proc_ops.STATUS] = self._proc_status()
            send_reply(self.outbox, self.cluster_id, self._reply_to, self.point.rank, value=None, extra=extra)
        else:
            type_name, text, tb, _ = pack_exception(error, 1)
            cause = f"{type_name.rsplit('.', 1)[-1]}: {text}"
            send_reply(self.outbox, self.cluster_id, self._reply_to, self.point.rank, error=error,
                       extra={proc_ops.ADDRESS: self.address, envelope.ERROR: cause, proc_ops.TRACEBACK: tb})
            if not init_fault:
                inbox.close(0)
                return
            self.dead = f"{self.mesh_name} rank {self.point.rank}: __init__ raised {cause}"
        self._has_cleanup = hasattr(instance, "__cleanup__")
        self.instance = instance  # (proc.workspace swaps its class for a reloaded one)
        if instance is not None:
            self._survives = type(instance)
        if self.stopping:  # stopped while __init__ ran: its stop message had nowhere to go
            inbox.close(0)
            return
        try:
            self._serve(inbox, instance)
        finally:
            inbox.close(0)
            if self._loop is not None:
                self._loop.close()

    def connect_to(self, caller) -> None:
        """Open this thread's connection to ``caller``'s inbox (the spawner's, or a client's
        that picked this mesh: ``proc_ops.CONNECT``) ahead of its calls, so that their first
        replies do not wait for its handshake, every proc's at once. Never waits."""
        if isinstance(caller, str):
            try:
                self.outbox.connect([caller], self.cluster_id.encode())
            except Exception:  # noqa: BLE001 - a bad address: the first reply connects (and says so) itself
                pass

    def _announce(self, caller, port) -> None:
        """Tell ``caller`` this actor's inbox, so that it connects while the constructors
        run (``proc_ops.ANNOUNCE``: ``port``, an int, is a client's reply port; ``True``:
        a router's, which takes the message by its op; false: nobody asked). Never waits,
        never raises: unannounced, the caller connects on its first call."""
        if not isinstance(caller, str) or not port:
            return
        header = {envelope.OP: proc_ops.ACTOR_BOUND, proc_ops.ADDRESS: self.address,
                  proc_ops.PROC: self._instance_info.proc_id}
        if type(port) is int:
            header[envelope.PORT] = port
        try:
            self.outbox.send(caller, wire_frames.encode(self.cluster_id, header))
        except Exception:  # noqa: BLE001 - (see above)
            pass

    def queue_failure(self, failure: dict, verdict_to: tuple[str, int]) -> None:
        """From the proc's control thread: ``failure`` of a mesh this actor owns goes
        before the next message this actor takes (its ``__supervise__`` runs first, or
        at once when it is idle or an ``async`` actor); its verdict is replied to
        ``verdict_to``."""
        self.failures.append((failure, verdict_to))
        if self.address is not None:  # (before its socket is bound, its loop starts with them)
            try:
                self.outbox.send(self.address, wire_frames.encode(self.cluster_id, {envelope.KIND: proc_ops.WAKE}))
            except Exception:  # noqa: BLE001 - without the wake it takes them before its next message anyway
                pass

    def take_failures(self, instance) -> None:
        """Run ``__supervise__`` on the failures its proc queued (sync ``__supervise__``;
        an ``async`` actor's loop takes them itself)."""
        while self.failures:
            failure, verdict_to = self.failures.popleft()
            self._supervise(instance, failure, verdict_to)

    def _serve(self, inbox: zmq.Socket, instance) -> None:
        if instance is not None and any(endpoint_names(type(instance)).values()):
            self._async = AsyncServer(self, inbox, instance)
            self._async.run()
            return
        guard = wire_frames.ReplayGuard()
        while True:
            if self.failures:  # queued before this message came: taken before it
                self.take_failures(instance)
            try:
                message = wire_frames.decode(sockets.recv_frames(inbox), guard)
            except wire_frames.BadMessage:
                continue
            try:
                if self.failures:
                    self.take_failures(instance)
                if self._serve_one(instance, message) == proc_ops.STOP:
                    return
            except BaseException:  # noqa: BLE001 - a bad message must not end the actor
                wire_frames.count_dropped()
                print(f"monarch_nb: actor {self.mesh_name}/{self.point.rank} dropped a message it could "
                      "not handle:", file=sys.stderr)
                traceback.print_exc()
            finally:
                set_call_origin(None)
                set_message_rank(None)
                call_chain.set_chain(None)
                # Not held while the next message arrives: a large one's memory can then
                # be reused for it (the VMs here take seconds for 1 GiB of fresh pages).
                message = None  # noqa: F841

    def _serve_one(self, instance, message: wire_frames.Message) -> str | None:
        """Handle one message by its kind; returns ``proc_ops.STOP`` to end the loop.
        Raises for a kind with no handler or a header missing a key."""
        header = message.header
        reply_to = (header[envelope.REPLY], header[envelope.PORT]) if envelope.PORT in header else None
        kind = header[envelope.KIND]
        handler = self._kinds.get(kind)
        if handler is None:
            raise ValueError(f"unknown message kind {kind!r}")
        return handler(instance, message, reply_to)

    def _stop(self, instance, message: wire_frames.Message, reply_to) -> str:
        cleanup = self.cleanup_hook(instance)
        if cleanup is not None:
            self.cleaned_up(self._call_user(self._run_endpoint, cleanup, "__cleanup__", (None,), {})[1])
        self.stopped(reply_to)
        return proc_ops.STOP

    def stopped(self, reply_to) -> None:
        """Answer the stop message: this actor's loop ends."""
        send_reply(self.outbox, self.cluster_id, reply_to, self.point.rank)

    def cleanup_hook(self, instance) -> Callable | None:
        """Monarch's ``__cleanup__(exc)`` of a live actor, called (``exc`` ``None``) as it
        is stopped, after the calls in progress ended (``def`` or ``async def``)."""
        return getattr(instance, "__cleanup__", None) if self.dead is None else None

    def cleaned_up(self, error: BaseException | None) -> None:
        if error is not None:
            type_name, text, tb, _ = pack_exception(error)
            print(f"__cleanup__ raised:\n{tb}", file=sys.stderr, end="")

    def _call(self, instance, message: wire_frames.Message, reply_to) -> None:
        if self.dead is not None:
            send_reply(self.outbox, self.cluster_id, reply_to, self.point.rank,
                       error=self._gone(), extra={proc_ops.DIED: True})
            return
        if self.stopping:  # as a call the hub's news of the stop failed first would: the actor is gone
            send_reply(self.outbox, self.cluster_id, reply_to, self.point.rank,
                       error=self._gone(f"{self.mesh_name} rank {self.point.rank}: its actor mesh was stopped "
                                        "before this call ran", stopped=True), extra={proc_ops.DIED: True})
            return
        set_call_origin(message.header.get(proc_ops.ORIGIN))
        set_message_rank(self.message_rank_of(message.header))
        call_chain.set_chain(self.chain(message, holds=True))
        self._handle(instance, message.header[proc_ops.ENDPOINT], message, reply_to)

    def message_rank_of(self, header: dict) -> Point | None:
        """This actor's point in the mesh or slice a call was sent to (``proc_ops.VIEW``:
        Monarch's ``message_rank``), ``None`` (its own point) when the call does not
        say. Kept per view: a handle sends the same one call after call."""
        spec = header.get(proc_ops.VIEW)
        try:
            return self._view_points[spec]
        except KeyError:
            pass
        except TypeError:  # unhashable: not a view this runtime sent
            return None
        try:
            point = Shape.from_spec(spec).point_of_base(self.point.rank) if spec is not None else None
        except (TypeError, ValueError):
            point = None
        if len(self._view_points) >= _VIEWS_KEPT:
            self._view_points.clear()
        self._view_points[spec] = point
        return point

    def chain(self, message: wire_frames.Message, holds: bool) -> call_chain.Chain:
        """The chain of actors waiting on the call ``message`` asks for, this one
        included when the call ``holds`` it (``proc.call_chain``)."""
        incoming = message.header.get(proc_ops.CHAIN)
        if not incoming and holds and self._own_chain is not None:  # a call from a client: the usual case
            return self._own_chain
        chain = call_chain.extend(incoming, self.address, f"{self.mesh_name}[{self.point.rank}]", holds)
        if not incoming and holds and self.address is not None:
            self._own_chain = chain
        return chain

    def _supervise_message(self, instance, message: wire_frames.Message, reply_to) -> None:
        self._supervise(instance, message.header[proc_ops.FAILURE], reply_to)

    def _supervise(self, instance, failure: dict, reply_to) -> None:
        """A mesh this actor spawned failed: ``__supervise__(failure)`` decides (truthy:
        handled). Without the method, or when it raises, the failure goes on up."""
        handler = getattr(instance, "__supervise__", None) if self.dead is None else None
        verdict, error = False, None
        if handler is not None:
            verdict, error = self._call_user(handler, MeshFailure.from_event(failure))
        self.supervised(verdict, error, reply_to, failure)

    def supervised(self, verdict, error: BaseException | None, reply_to, failure: dict) -> None:
        """Reply what ``__supervise__`` returned (``verdict``) or raised (``error``) for
        ``failure``. Unhandled, it kills this live actor (Monarch), whose own death then
        carries it up, unless its class says ``survive_unhandled_children``: then the
        hub passes it on up itself."""
        why, tb = None, ""
        if error is not None:
            type_name, text, tb, _ = pack_exception(error)
            why = f"__supervise__ raised {type_name.rsplit('.', 1)[-1]}: {text}"
        handled = error is None and bool(verdict)
        dies = not handled and self.dead is None and not self._survives.survive_unhandled_children
        if error is not None and not dies:
            print(tb, file=sys.stderr, end="")
        send_reply(self.outbox, self.cluster_id, reply_to, self.point.rank,
                   extra={proc_ops.HANDLED: handled, envelope.ERROR: why, proc_ops.OWNER_DIED: dies})
        if dies:
            hit = ", ".join(failure.get("meshes") or [failure.get("proc_mesh") or "a mesh it owns"])
            lead = f"{why} handling" if why else "__supervise__ did not handle"
            # Monarch's report of a dead child, when it is one: the owner's report nests it.
            self._fail("__supervise__", f"{lead} a failure of {hit}: {failure.get('report') or failure['why']}",
                       tb, None)

    def _handle(self, instance, name: str, message: wire_frames.Message, reply_to) -> None:
        call = self.prepare(instance, name, message, reply_to)
        if isinstance(call, BaseException):
            self.finish(name, None, call, reply_to, explicit=False)
            return
        method, args, kwargs, explicit = call
        self.begin(name)
        self.running_call = (self.calls, reply_to)  # then checked: see cancel()
        if self.cancelled(reply_to):
            result, error = None, _refused()
        else:
            result, error = self._call_user(self._run_endpoint, method, name, args, kwargs)
        self.running_call = None
        self.end()
        self.finish(name, result, error, reply_to, explicit)

    def prepare(self, instance, name: str, message: wire_frames.Message, reply_to):
        """The call ``message`` asks for: ``(method, args, kwargs, explicit)`` (an
        explicit-port endpoint gets its port as first argument), or the error to reply."""
        if self.cancelled(reply_to):
            return _refused()
        method = getattr(instance, name, None)
        if not is_endpoint(method):
            return AttributeError(f"{type(instance).__name__}.{name} is not an endpoint")
        try:
            via = message.header.get(proc_ops.VIA)
            if via:  # through a host router: the client's ports in the arguments go back through it
                with wire_port.unpickling_routed(*via):
                    args, kwargs = message.value()
            else:
                args, kwargs = message.value()
        except BaseException as e:  # noqa: BLE001 - e.g. an argument's class is not importable here
            return e
        explicit = takes_port(method)
        if explicit:  # it answers through this port itself, as often and as late as it likes
            args = (self._port(reply_to), *args)
        return method, args, kwargs, explicit

    def begin(self, name: str) -> None:
        """A call of endpoint ``name`` starts (interrupts land only while calls run)."""
        self.current = (name, time.time())
        self.calls += 1
        self._running += 1
        self.busy = True

    def end(self) -> None:
        self._running -= 1
        if self._running == 0:
            self.busy = False
            self.current = None
        end_of_call()  # a last line without newline goes out before the reply

    def finish(self, name: str, result, error: BaseException | None, reply_to, explicit: bool) -> None:
        """Reply a finished call's ``result`` or ``error``; an error may kill the actor."""
        if self.proc_ending:
            return
        if self.dead is not None:  # it died while this call ran (e.g. of a failure it did not handle)
            send_reply(self.outbox, self.cluster_id, reply_to, self.point.rank,
                       error=self._gone(), extra={proc_ops.DIED: True})
        elif error is None:
            if not explicit:
                send_reply(self.outbox, self.cluster_id, reply_to, self.point.rank, value=result,
                           what=f"return value of {self.mesh_name}.{name}")
        elif kills_actor(error) or (explicit and not isinstance(error, KeyboardInterrupt)):
            # Monarch: an explicit-port endpoint that raises instead of answering kills its actor.
            self._die(name, error, reply_to)
        elif reply_to is not None:
            send_reply(self.outbox, self.cluster_id, reply_to, self.point.rank, error=error)
        elif isinstance(error, KeyboardInterrupt) or self._survives.survive_broadcast_errors:
            self._report_broadcast_failure(name, error)  # a supervision event; the actor lives on
        else:  # Monarch: nobody to answer to, so the error is a fault that kills the actor
            self._die(name, error, None, how="broadcast ")

    def step_endpoint(self, step: Callable, arg, name: str):
        """One step of an async endpoint's coroutine (``send`` or ``throw``), telling the
        proc's hooks of an exception it ends with, as :meth:`_run_endpoint` does."""
        try:
            yielded = step(arg)
        except StopIteration:
            raise
        except BaseException as e:
            if self._on_endpoint_error is not None and not self.forked_child():
                self._on_endpoint_error(e, name)  # the debugger's post-mortem: paused here first
            raise
        # A forked child awaiting would run on its copy of this actor's event loop,
        # whose epoll set and inbox are its parent's.
        self._leave_if_forked(None, suspended=True)
        return yielded

    def _port(self, reply_to: tuple[str, int] | None) -> wire_port.Port:
        """The port a call's caller waits on (one that drops values, for a broadcast)."""
        if reply_to is None:
            return wire_port.Port(None, 0, self.point.rank, self.cluster_id)
        return wire_port.Port(*reply_to, self.point.rank, self.cluster_id)

    def _run_endpoint(self, method, name: str, args, kwargs):
        try:
            result = method(*args, **kwargs)
            if type(result) not in _NEVER_AWAITED and inspect.isawaitable(result):  # run before the next message
                if self._loop is None:
                    self._loop = asyncio.new_event_loop()
                result = self._loop.run_until_complete(result)
        except BaseException as e:
            if self._on_endpoint_error is not None and not self.forked_child():
                self._on_endpoint_error(e, name)  # the debugger's post-mortem: paused here first
            raise
        return result

    def _report_broadcast_failure(self, name: str, error: BaseException) -> None:
        type_name, text, tb, _ = pack_exception(error)
        print(f"broadcast {name} raised:\n{tb}", file=sys.stderr, end="")  # tagged with mesh and rank
        self._report_failure(name, f"{type_name.rsplit('.', 1)[-1]}: {text}", tb)

    def _die(self, name: str, error: BaseException, reply_to, how: str = "") -> None:
        """``error`` from endpoint ``name`` (called ``how``: ``"broadcast "`` or not)
        kills this actor (see :meth:`_fail`)."""
        type_name, text, tb, _ = pack_exception(error)
        raised = f"{type_name.rsplit('.', 1)[-1]}: {text}" if text else type_name.rsplit('.', 1)[-1]
        self._fail(name, f"{how}{name} raised {raised}", tb, reply_to)

    def _fail(self, name: str, cause: str, tb: str, reply_to) -> None:
        """This actor dies for ``cause`` (a sentence naming ``name``, the endpoint or hook
        it died in): the hub, the owner and the clients learn it, then its caller (if
        any) and every later call get a supervision failure."""
        self.dead = f"{self.mesh_name} rank {self.point.rank}: {cause}"
        print(f"{cause}; the actor is dead:\n{tb}", file=sys.stderr, end="")
        self._report_failure(name, cause, tb, dead=True)  # the owner first (Monarch's order)
        send_reply(self.outbox, self.cluster_id, reply_to, self.point.rank,
                   error=self._gone(), extra={proc_ops.DIED: True, proc_ops.ALONE: True})

    def _gone(self, why: str | None = None, stopped: bool = False) -> SupervisionError:
        """What a call to this actor fails with once it is dead (its failure report: see
        ``dead``), or ``stopped`` (for ``why``)."""
        name = actor_name(self._instance_info.class_name, self.mesh_name, dict(self.point.extent), self.point.rank)
        return SupervisionError(actor_gone_report(name, why or self.dead or "it died", stopped))

    def _report_failure(self, name: str, cause: str, tb: str, dead: bool = False) -> None:
        """Tell the hub that endpoint ``name`` failed: ``cause`` is the exception
        (``Type: text``) of a broadcast the actor survives, or why a ``dead`` actor died.
        A death's report waits for the hub's answer (at most ``REPORT_WAIT_S``): the
        hub answers once the owner's proc has queued the failure for the owner, so the
        replies this actor sends after it (its callers' errors) reach nobody before the
        owner has it (see ``hub.supervision``)."""
        if self.hub is None:
            return
        header = {envelope.OP: hub_ops.ACTOR_FAILED, proc_ops.MESH: self.mesh_name,
                  proc_ops.PROC: self._instance_info.proc_id, envelope.RANK: self.point.rank,
                  hub_ops.FAILED_ENDPOINT: name, hub_ops.FAILED_TRACEBACK: tb, hub_ops.ACTOR_DEAD: dead,
                  **({hub_ops.FAILED_CAUSE: cause} if dead else {envelope.ERROR: cause})}
        if not dead:
            self.outbox.send(self.hub, wire_frames.encode(self.cluster_id, header))
            return
        answers, address = sockets.bind_inbox()  # once in an actor's life: it dies once
        try:
            self.outbox.send(self.hub, wire_frames.encode(self.cluster_id, {
                **header, envelope.REPLY: address, envelope.PORT: 0}))
            deadline = time.monotonic() + REPORT_WAIT_S
            while answers.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                try:
                    wire_frames.decode(sockets.recv_frames(answers, zmq.NOBLOCK), None)
                    return
                except wire_frames.BadMessage:
                    continue
            print(f"monarch_nb: the hub did not answer {self.mesh_name}/{self.point.rank}'s failure report within "
                  f"{REPORT_WAIT_S} s; answering its callers first", file=sys.stderr)
        finally:
            answers.close(0)


def _refused() -> KeyboardInterrupt:
    return KeyboardInterrupt("the caller interrupted this call (Ctrl-C) before it began")


def kills_actor(error: BaseException) -> bool:
    """Monarch's rule: a ``BaseException`` that is not an ``Exception`` kills the actor.
    A ``KeyboardInterrupt`` is spared: it is how ``%monarch interrupt`` stops one call."""
    return not isinstance(error, (Exception, KeyboardInterrupt))
