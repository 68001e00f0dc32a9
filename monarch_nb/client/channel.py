"""``Channel.open()``: a :class:`~monarch_nb.wire.port.Port` and the
:class:`PortReceiver` its values arrive at (Monarch's low-level messaging).

The receiver is a port of this process's mailbox: values sent through the port (from
this process, another thread, or an actor it was passed to) are queued there in
arrival order, and each ``recv()`` is a :class:`Future` of the next one.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Generic, TypeVar

from ..protocol import envelope
from ..wire import frames as wire_frames
from ..wire.interrupts import protected
from ..wire.port import Port, local_cluster
from ..wire.remote_error import unpack_exception
from .future import Future
from .runtime import runtime

R = TypeVar("R")


class PortReceiver(Generic[R]):
    """Receives what the matching :class:`Port` is sent, in order; ``ranked()``
    receives ``(rank, value)`` pairs instead. Close it to drop its mailbox port."""

    def __init__(self, ranked: bool = False):
        rt = runtime()
        self._runtime = rt
        self._ranked = ranked
        self._lock = threading.Lock()
        self._arrived: collections.deque = collections.deque()  # (value, error) not yet received
        self._waiting: collections.deque[Future] = collections.deque()  # recv()s not yet answered
        self.port_number = rt.mailbox.open_port(self._on_message)

    def _on_message(self, message: wire_frames.Message) -> None:
        """On the dispatching thread: hand the value to the oldest recv(), or queue it."""
        interrupted = None
        try:
            value, error = self._read(message)
        except KeyboardInterrupt as e:
            # The client's own Ctrl-C under a SIGINT handler of the user's own, not the
            # value's error: read it again, raise the interrupt once the value is handed on.
            interrupted = e
            try:
                value, error = self._read(message)
            except KeyboardInterrupt as again:  # twice: the value's own
                value, error, interrupted = None, again, None
        with self._lock:
            if not self._waiting:
                self._arrived.append((value, error))
                future = None
            else:
                future = self._waiting.popleft()
        if future is not None:
            future._resolve(value, error)
        if interrupted is not None:
            raise interrupted

    def _read(self, message: wire_frames.Message) -> tuple[Any, BaseException | None]:
        """``(value, None)`` or ``(None, error)``; raises only KeyboardInterrupt."""
        try:
            value = message.value()
            if not message.header[envelope.OK]:
                return None, unpack_exception(value)[0]
            return ((message.header.get(envelope.RANK), value) if self._ranked else value), None
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - a value we can't unpickle here
            return None, e

    @protected
    def recv(self) -> Future[R]:
        """A future of the next value (it raises what the sender passed to ``exception``)."""
        future: Future = Future(self._runtime, "PortReceiver.recv")
        with self._lock:
            if not self._arrived:
                self._waiting.append(future)
                return future
            value, error = self._arrived.popleft()
        future._resolve(value, error)
        return future

    def ranked(self) -> "PortReceiver":
        """This receiver, yielding ``(rank, value)``: the rank of the actor that sent it
        (``None`` for a port from ``Channel.open()`` used outside a call)."""
        self._ranked = True
        return self

    def close(self) -> None:
        self._runtime.mailbox.close_port(self.port_number)


class Channel(Generic[R]):
    """Opens port/receiver pairs (``Channel[int].open()`` as in Monarch)."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port, PortReceiver]:
        """A new port and its receiver in this process. ``once`` is accepted for
        Monarch compatibility (a port here may always send more than one value)."""
        receiver: PortReceiver = PortReceiver()
        port = Port(runtime().mailbox.address, receiver.port_number, None, local_cluster())
        return port, receiver

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port, PortReceiver]:
        port, receiver = Channel.open(once)
        return port, receiver.ranked()

