"""An IDE's way in to a paused rank: a TCP port on the client's 127.0.0.1 whose DAP
bytes travel to the rank's proc as signed messages (so the proc may be on another
host, and no port other than this loopback one is opened).

IDE ──TCP 127.0.0.1:PORT──► Relay ──signed zmq (relay_data)──► proc's control inbox
    ◄──────────────────────        ◄── signed zmq (k: relay) ── proc's debug mux

One IDE connection at a time; when it closes, the port takes the next one. The relay
tells the proc it is alive every ``ALIVE_S`` seconds (a proc drops an IDE session
whose relay fell silent: its client went away).

A port on 127.0.0.1 takes connections from every local user, and whoever drives the
paused rank runs code as the cluster's owner. So a connection is admitted only when
the socket at its other end belongs to this process's user (``peer.peer_uid``: the uid
the kernel lists for it in ``/proc/net/tcp``); any other is closed before a byte is
read, said on stderr, counted (``.refused``) and reported to the hub, whose health
shows the count (``hub.relay_refused``).
"""

from __future__ import annotations

import os
import pwd
import secrets
import socket
import sys
import threading
import time

import zmq

from ..protocol import debug as debug_ops
from ..protocol import envelope, hub_ops, proc_ops
from ..wire import frames as wire_frames
from ..wire import sockets
from .dap import no_delay
from .peer import peer_uid

ALIVE_S = 1.0


class Relay:
    """Listens on ``127.0.0.1:port`` (``port`` 0: a free one; see ``.port``) for one
    IDE at a time, of this process's user only, and carries its DAP session to the proc
    at ``proc_address``; connections of other users are refused and reported to the hub
    at ``hub_address`` (when given). Runs on a daemon thread until :meth:`close`."""

    def __init__(self, cluster_id: str, proc_address: str, label: str = "", port: int = 0,
                 hub_address: str | None = None):
        self.cluster_id = cluster_id
        self.proc_address = proc_address
        self.label = label
        self.hub_address = hub_address
        self.refused = 0  # connections refused: another user's, or one whose owner could not be found
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port = self._listener.getsockname()[1]
        self._inbox, self._inbox_address = sockets.bind_inbox()
        self._outbox = sockets.Outbox()
        self._closed = threading.Event()
        self.connections = 0  # IDE connections served so far
        self._thread = threading.Thread(target=self._run, name=f"monarch-nb-relay-{self.port}", daemon=True)
        self._thread.start()

    def _send(self, action: str, session: str, **fields) -> None:
        self._outbox.send(self.proc_address, wire_frames.encode(
            self.cluster_id, {envelope.OP: proc_ops.DEBUG, debug_ops.ACTION: action, debug_ops.SESSION: session,
                              **fields}))

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._listener.fileno(), zmq.POLLIN)
        poller.register(self._inbox, zmq.POLLIN)
        conn: socket.socket | None = None
        session = ""
        last_alive = 0.0
        guard = wire_frames.ReplayGuard()
        try:
            while not self._closed.is_set():
                ready = dict(poller.poll(int(ALIVE_S * 1000 / 2)))
                if self._listener.fileno() in ready:
                    new, _ = self._listener.accept()
                    if not self._admit(new):
                        new.close()
                    elif conn is not None:  # one IDE at a time
                        new.close()
                    else:
                        conn = new
                        no_delay(conn)
                        session = secrets.token_hex(6)
                        self._send(debug_ops.RELAY_OPEN, session, **{debug_ops.TO: self._inbox_address})
                        poller.register(conn.fileno(), zmq.POLLIN)
                        self.connections += 1
                if conn is not None and conn.fileno() in ready:
                    data = b""
                    try:
                        data = conn.recv(1 << 16)
                    except OSError:
                        pass
                    if data:
                        self._send(debug_ops.RELAY_DATA, session, **{debug_ops.DATA: data})
                    else:
                        self._send(debug_ops.RELAY_CLOSE, session)
                        poller.unregister(conn.fileno())
                        conn.close()
                        conn, session = None, ""
                if self._inbox in ready:
                    while self._inbox.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                        try:
                            message = wire_frames.decode(sockets.recv_frames(self._inbox, zmq.NOBLOCK), guard)
                        except wire_frames.BadMessage:
                            continue
                        if conn is not None and message.header.get(debug_ops.SESSION) == session:
                            try:
                                conn.sendall(message.header[debug_ops.DATA])
                            except OSError:
                                pass  # the IDE went away: noticed on its next read
                now = time.monotonic()
                if conn is not None and now - last_alive >= ALIVE_S:
                    self._send(debug_ops.RELAY_ALIVE, session)
                    last_alive = now
        finally:
            if conn is not None:
                self._send(debug_ops.RELAY_CLOSE, session)
                conn.close()
            self._listener.close()
            self._inbox.close(0)

    def _admit(self, conn: socket.socket) -> bool:
        """Is ``conn`` from a socket of this process's user? If not: said on stderr,
        counted, and reported to the hub (one-way: never waits)."""
        uid = peer_uid(conn)
        if uid == os.geteuid():
            return True
        self.refused += 1
        who = "a process whose owner could not be found" if uid is None else _user(uid)
        print(f"monarch_nb: the debugger relay on 127.0.0.1:{self.port} ({self.label}) refused a connection from "
              f"{who}: only an IDE of {_user(os.geteuid())} may attach (it runs code as that user)",
              file=sys.stderr, flush=True)
        if self.hub_address is not None:
            self._outbox.send(self.hub_address, wire_frames.encode(
                self.cluster_id, {envelope.OP: hub_ops.DEBUG_RELAY_REFUSED, hub_ops.REFUSED_UID: uid,
                                  hub_ops.REFUSED_PORT: self.port}))
        return False

    def launch_config(self, remote_cwd: str | None = None) -> dict:
        """A VS Code ``launch.json`` entry that attaches to this relay. ``remote_cwd``:
        the proc's working directory when it runs on another host (mapped to the
        workspace folder)."""
        config = {"name": f"monarch_nb: {self.label}" if self.label else "monarch_nb", "type": "debugpy",
                  "request": "attach", "connect": {"host": "127.0.0.1", "port": self.port}, "justMyCode": True}
        if remote_cwd:
            config["pathMappings"] = [{"localRoot": "${workspaceFolder}", "remoteRoot": remote_cwd}]
        return config

    def close(self) -> None:
        """Stop listening and end the IDE's session (the rank stays paused)."""
        self._closed.set()
        self._thread.join(5)

    def __repr__(self) -> str:
        return f"<Relay {self.label} on 127.0.0.1:{self.port}>"


def _user(uid: int) -> str:
    """``user alice (uid 1000)``, or ``uid 1000`` for a uid without a name."""
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
