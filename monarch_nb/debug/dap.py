"""The Debug Adapter Protocol's wire format, and a small DAP client.

A DAP stream is a sequence of JSON messages, each preceded by a
``Content-Length: N\\r\\n\\r\\n`` header (N: bytes of the UTF-8 JSON body). Messages are
requests (``seq``, ``command``, ``arguments``), responses (``request_seq``,
``success``, ``body`` or ``message``) and events (``event``, ``body``).
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Callable

from . import pydevd_adapter

_HEADER_END = b"\r\n\r\n"


class DapError(Exception):
    """A DAP request failed (``success: false``), timed out, or the stream closed."""


def encode(message: dict) -> bytes:
    """One framed message (header and body in one buffer, so it goes out in one send)."""
    body = json.dumps(message, separators=(",", ":")).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


class Parser:
    """Cuts a byte stream into DAP messages: ``feed(data)`` returns the complete ones."""

    def __init__(self):
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict]:
        self._buf += data
        out = []
        while True:
            end = self._buf.find(_HEADER_END)
            if end < 0:
                return out
            length = None
            for line in bytes(self._buf[:end]).split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if length is None:
                raise DapError(f"DAP header without Content-Length: {bytes(self._buf[:end])!r}")
            start = end + len(_HEADER_END)
            if len(self._buf) < start + length:
                return out
            out.append(json.loads(bytes(self._buf[start:start + length])))
            del self._buf[:start + length]


def no_delay(sock: socket.socket) -> None:
    """Send small writes at once: with Nagle's algorithm a header and body written
    separately wait for the peer's delayed ACK, ~40 ms per message on loopback. (A Unix
    socket, e.g. a proc's socketpair to pydevd, has no such delay: left as it is.)"""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class DapClient:
    """A DAP client over a connected socket. ``request`` blocks for the response;
    events (and requests from the peer, e.g. ``runInTerminal``) go to ``on_event``,
    called on the reader thread in arrival order (it must not call ``request``)."""

    def __init__(self, sock: socket.socket, on_event: Callable[[dict], None] | None = None,
                 name: str = "monarch-nb-dap"):
        no_delay(sock)
        self._sock = sock
        self._on_event = on_event or (lambda message: None)
        self._seq = 0
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._responses: dict[int, dict] = {}
        self._callbacks: dict[int, Callable[[dict], None]] = {}
        self.closed = False
        self.thread = threading.Thread(target=self._read, name=name, daemon=True)
        # debugpy must neither trace nor suspend this thread, nor list it to IDEs.
        pydevd_adapter.hide_thread(self.thread)
        self.thread.start()

    @classmethod
    def connect(cls, host: str, port: int, on_event=None, timeout: float = 10.0, name: str = "monarch-nb-dap"):
        return cls(socket.create_connection((host, port), timeout=timeout), on_event, name)

    def send(self, message: dict) -> int:
        """Send ``message`` with the next ``seq`` (returned)."""
        with self._send_lock:
            self._seq += 1
            message = {**message, "seq": self._seq}
            self._sock.sendall(encode(message))
            return self._seq

    def request_async(self, command: str, arguments: dict, callback: Callable[[dict], None]) -> None:
        """Send a request; ``callback(response)`` runs on the reader thread when it comes
        (with ``success: false`` if the stream closed first)."""
        with self._send_lock:
            self._seq += 1
            seq = self._seq
            with self._cond:
                self._callbacks[seq] = callback
            try:
                self._sock.sendall(encode({"seq": seq, "type": "request", "command": command,
                                           "arguments": arguments}))
            except OSError:
                with self._cond:
                    self._callbacks.pop(seq, None)
                callback({"type": "response", "request_seq": seq, "command": command, "success": False,
                          "message": "the debugger connection is closed"})

    def request(self, command: str, timeout: float | None = 30.0, **arguments) -> dict:
        """Send a request and wait for its response; returns the response's ``body``
        (``{}`` when it has none). Raises :class:`DapError` on failure or timeout."""
        try:
            seq = self.send({"type": "request", "command": command, "arguments": arguments})
        except OSError as e:
            raise DapError(f"DAP {command}: the connection is closed ({e})") from None
        with self._cond:
            if not self._cond.wait_for(lambda: seq in self._responses or self.closed, timeout):
                raise DapError(f"DAP {command}: no response within {timeout} s")
            response = self._responses.pop(seq, None)
        if response is None:
            raise DapError(f"DAP {command}: the connection closed")
        if not response.get("success"):
            raise DapError(response.get("message") or f"DAP {command} failed")
        return response.get("body") or {}

    def _read(self) -> None:
        parser = Parser()
        self._sock.settimeout(None)
        try:
            while True:
                data = self._sock.recv(1 << 16)
                if not data:
                    break
                for message in parser.feed(data):
                    if message.get("type") == "response":
                        with self._cond:
                            callback = self._callbacks.pop(message["request_seq"], None)
                            if callback is None:
                                self._responses[message["request_seq"]] = message
                                self._cond.notify_all()
                        if callback is not None:
                            callback(message)
                    else:
                        try:
                            self._on_event(message)
                        except Exception:  # a broken handler must not end the stream
                            import traceback

                            traceback.print_exc()
        except (OSError, DapError):
            pass
        finally:
            with self._cond:
                self.closed = True
                self._cond.notify_all()
                orphans, self._callbacks = self._callbacks, {}
            for seq, callback in orphans.items():
                callback({"type": "response", "request_seq": seq, "success": False,
                          "message": "the debugger connection closed"})
            self._on_event({"type": "event", "event": "_closed"})

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
