"""One actor's message loop: its own thread, its own inbox socket.

Messages to an actor go straight to its socket (no hand-off through the proc), and
are handled one at a time in arrival order. ``async def`` endpoints run to
completion on the actor's own event loop before the next message is taken.
Replies go straight to the caller's mailbox.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import inspect
import os
import sys
import threading
import time
import traceback

import zmq

from ..errors import MeshFailure
from ..mesh import Point
from ..wire import frames as wire_frames
from ..wire import sockets
from ..wire.remote_error import pack_exception
from . import activity
from .actor import Actor, ActorInstance, Context, _set_current, is_endpoint
from .stdio import end_of_call, set_call_origin


def send_reply(outbox: sockets.Outbox, cluster_id: str, reply_to: tuple[str, int] | None,
               rank: int, value=None, error: BaseException | None = None, what: str = "return value",
               extra: dict | None = None) -> None:
    """Send ``value`` (or ``error``) to ``reply_to = (address, port)``; no-op without one.

    A value that can't be pickled is turned into an error reply naming it."""
    if reply_to is None:
        return
    address, port = reply_to
    header = {"port": port, "rank": rank, **(extra or {})}
    if error is None:
        try:
            frames = wire_frames.encode_value(cluster_id, {**header, "ok": True}, value, what)
        except Exception as e:  # SerializationError, MessageTooLarge
            error = e
    if error is not None:
        frames = wire_frames.encode_value(cluster_id, {**header, "ok": False}, pack_exception(error, 1))
    outbox.send(address, frames)


class ActorThread:
    """Runs one actor: constructs it, then serves its inbox until stopped."""

    def __init__(self, cluster_id: str, mesh_name: str, point: Point, proc_id: str,
                 spawn: wire_frames.Message, reply_to: tuple[str, int], outbox: sockets.Outbox,
                 main_thread: bool = False, hub: str | None = None):
        self.cluster_id = cluster_id
        self.mesh_name = mesh_name
        self.point = point
        self.outbox = outbox
        self.hub = hub  # where failures nobody can be told of go (None: this_proc, no hub)
        self._spawn = spawn
        self._reply_to = reply_to
        self._instance_info = ActorInstance(mesh_name, point, proc_id, os.getpid())
        self._loop: asyncio.AbstractEventLoop | None = None
        self.address: str | None = None
        self.busy = False  # handling a message (an interrupt is delivered only then)
        self.current: tuple[str, float] | None = None  # endpoint running, since (wall clock, s)
        # An actor on the proc's main thread (``%%monarch exec``) can be interrupted even
        # in a blocking call such as time.sleep: SIGINT interrupts the main thread only.
        self.thread = (threading.main_thread() if main_thread else
                       threading.Thread(target=self._run, name=f"actor-{mesh_name}-{point.rank}", daemon=True))

    @property
    def on_main_thread(self) -> bool:
        return self.thread is threading.main_thread()

    def start(self) -> None:
        """Run the actor on its own thread (one on the main thread is run by the proc)."""
        if not self.on_main_thread:
            self.thread.start()

    def run(self) -> None:
        self._run()

    def interrupt_thread(self) -> bool:
        """Raise ``KeyboardInterrupt`` in the endpoint this thread actor is running, if
        any. It lands at the next Python bytecode: a blocking C call finishes first."""
        if not self.busy or self.on_main_thread or self.thread.ident is None:
            return False
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread.ident),
                                                   ctypes.py_object(KeyboardInterrupt))
        return True

    def status(self) -> dict:
        """``state`` idle, busy (``endpoint``, ``since``) or paused (where, since)."""
        stop = activity.paused(self.thread.ident)
        if stop is not None:
            return {"state": "paused", **stop}
        current = self.current
        if current is None:
            return {"state": "idle"}
        return {"state": "busy", "endpoint": current[0], "since": current[1]}

    def _context(self) -> Context:
        return Context(self._instance_info, self.point)

    def _construct(self):
        cls, args, kwargs = self._spawn.value()
        if not (isinstance(cls, type) and issubclass(cls, Actor)):
            raise TypeError(f"{cls!r} is not an Actor subclass")
        return cls(*args, **kwargs)

    def _run(self) -> None:
        # A restarted actor takes its predecessor's address when free: handles keep working.
        inbox, self.address = sockets.bind_inbox(prefer=self._spawn.header.get("prefer"))
        self._instance_info = dataclasses.replace(self._instance_info, address=self.address)
        _set_current(self._context())
        set_call_origin(self._spawn.header.get("o"))  # what __init__ prints goes to the spawner
        try:
            instance = self._construct()
        except BaseException as e:
            send_reply(self.outbox, self.cluster_id, self._reply_to, self.point.rank, error=e,
                       extra={"address": self.address})
            inbox.close(0)
            return
        finally:
            self._spawn = None  # drop the class/argument buffers
        set_call_origin(None)
        send_reply(self.outbox, self.cluster_id, self._reply_to, self.point.rank,
                   value=None, extra={"address": self.address})
        try:
            self._serve(inbox, instance)
        finally:
            inbox.close(0)
            if self._loop is not None:
                self._loop.close()

    def _serve(self, inbox: zmq.Socket, instance) -> None:
        while True:
            try:
                message = wire_frames.decode(sockets.recv_frames(inbox))
            except wire_frames.BadMessage:
                continue
            header = message.header
            reply_to = (header["reply"], header["port"]) if "port" in header else None
            if header["k"] == "stop":
                send_reply(self.outbox, self.cluster_id, reply_to, self.point.rank)
                return
            if header["k"] == "supervise":
                self._supervise(instance, header["failure"], reply_to)
                continue
            set_call_origin(header.get("o"))
            self._handle(instance, header["ep"], message, reply_to)
            set_call_origin(None)

    def _supervise(self, instance, failure: dict, reply_to) -> None:
        """A mesh this actor spawned failed: ``__supervise__(failure)`` decides (truthy:
        handled). Without the method, or when it raises, the failure goes on up."""
        handler = getattr(instance, "__supervise__", None)
        handled, error = False, None
        if handler is not None:
            try:
                handled = bool(handler(MeshFailure.from_event(failure)))
            except Exception as e:  # noqa: BLE001 - reported with the failure
                error = f"__supervise__ raised {type(e).__name__}: {e}"
                traceback.print_exc()
        send_reply(self.outbox, self.cluster_id, reply_to, self.point.rank,
                   extra={"handled": handled, "error": error})

    def _handle(self, instance, name: str, message: wire_frames.Message, reply_to) -> None:
        try:
            method = getattr(instance, name, None)
            if not is_endpoint(method):
                raise AttributeError(f"{type(instance).__name__}.{name} is not an endpoint")
            args, kwargs = message.value()
            self.current = (name, time.time())
            self.busy = True  # interrupts land only while user code runs
            try:
                result = method(*args, **kwargs)
                if inspect.isawaitable(result):
                    if self._loop is None:
                        self._loop = asyncio.new_event_loop()
                    result = self._loop.run_until_complete(result)
            except BaseException as e:
                from ..debug import session as debug_session  # here: imports actor_loop itself

                debug_session.endpoint_failed(e, name)  # with post-mortem on: paused here first
                raise
            finally:
                self.busy = False
                self.current = None
                end_of_call()  # a last line without newline goes out before the reply
        except BaseException as e:  # noqa: BLE001 - every failure goes to the caller
            if reply_to is None:  # nobody to reply to: a supervision event
                print(f"broadcast {name} raised:", file=sys.stderr)  # tagged with mesh and rank
                sys.excepthook(type(e), e, e.__traceback__)
                if self.hub is not None:
                    self.outbox.send(self.hub, wire_frames.encode(self.cluster_id, {
                        "op": "actor_failed", "mesh": self.mesh_name, "rank": self.point.rank, "endpoint": name,
                        "error": f"{type(e).__name__}: {e}",
                        "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__))}))
                return
            send_reply(self.outbox, self.cluster_id, reply_to, self.point.rank, error=e)
            return
        send_reply(self.outbox, self.cluster_id, reply_to, self.point.rank, value=result,
                   what=f"return value of {self.mesh_name}.{name}")
