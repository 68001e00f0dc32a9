"""A proc's control loop: spawns and stops actors on the hub's orders.

Control messages (from the hub) arrive on the proc's own inbox; endpoint calls never
pass through here: each actor has its own socket (see ``actor_loop``).
"""

from __future__ import annotations

import _thread
import os
import queue
import signal
import sys
import threading
import time

import psutil

from ..mesh import Extent
from ..wire import frames as wire_frames
from ..wire import interrupts, sockets
from .actor_loop import ActorThread, send_reply
from ..debug import session as debug_session
from . import torch_env


INTERRUPT_RETRY_S = 0.001  # how often an interrupt that can't land yet is tried again
INTERRUPT_FOR_S = 5.0  # how long it is tried (while the same call runs)
STOP_WAIT_S = 2.0  # how long a stop waits for an interrupted actor to end before reporting it


class ProcServer:
    """Serves one proc's control inbox until told to exit."""

    def __init__(self, cluster_id: str, proc_id: str, main_work: queue.Queue | None = None,
                 has_hub: bool = True):
        self.cluster_id = cluster_id
        self.proc_id = proc_id
        self.has_hub = has_hub  # False for this_proc(): spawn requests then come from the client
        self.main_work = main_work  # where actors that run on the main thread go (None: nowhere)
        self.outbox = sockets.Outbox()
        self.inbox, self.address = sockets.bind_inbox()
        self.guard = wire_frames.ReplayGuard()
        self.actors: dict[str, ActorThread] = {}
        self._main_redelivery = False  # the next SIGINT is our own retry for the main-thread actor

    @interrupts.protected
    def interrupt(self, frame) -> None:
        """SIGINT handler (main thread; ``frame`` is where it arrived): KeyboardInterrupt
        into the user code of every actor busy with a message, landing only there (see
        ``actor_loop``); an actor momentarily in the runtime's code gets it as soon as
        it is back in its own, while the same call runs."""
        redelivery, self._main_redelivery = self._main_redelivery, False
        actors = list(self.actors.values())
        on_main = next((a for a in actors if a.on_main_thread), None)
        if not redelivery:
            targets = [(a, a.calls) for a in actors if not a.on_main_thread and a.busy]
            if targets:
                threading.Thread(target=self._interrupt_threads, args=(targets,), daemon=True,
                                 name="monarch-nb-interrupt").start()
        if on_main is None or not on_main.busy:
            return
        if on_main.in_user_code(frame):
            raise KeyboardInterrupt
        calls = on_main.calls

        def retry() -> None:
            if on_main.busy and on_main.calls == calls:
                self._main_redelivery = True
                _thread.interrupt_main(signal.SIGINT)

        threading.Timer(interrupts.REDELIVER_S, retry).start()

    def _stop_actor(self, actor: ActorThread, header: dict) -> None:
        """Stop ``actor``: calls still queued are refused, the one running (or its
        ``__init__``) is interrupted, and the reply says whether its thread ended within
        ``STOP_WAIT_S`` (``stopped``) and, if not, what it is still running."""
        actor.stopping = True
        if actor.address is not None:
            self.outbox.send(actor.address, wire_frames.encode(self.cluster_id, {"k": "stop"}))
        if actor.busy:
            if actor.on_main_thread:
                self._main_redelivery = True  # only the main thread's actor, not every actor
                _thread.interrupt_main(signal.SIGINT)
            else:
                threading.Thread(target=self._interrupt_threads, args=([(actor, actor.calls)],), daemon=True,
                                 name="monarch-nb-interrupt").start()
        stopped = actor.finished.wait(STOP_WAIT_S)
        current = actor.current
        self._reply(header, stopped=stopped, running=None if stopped or current is None else current[0])
        self.outbox.close_thread_sockets()  # this thread ends

    @staticmethod
    def _interrupt_threads(targets: list) -> None:
        deadline = time.monotonic() + INTERRUPT_FOR_S
        while targets and time.monotonic() < deadline:
            targets = [(a, calls) for a, calls in targets
                       if a.busy and a.calls == calls and not a.interrupt_thread()]
            if targets:
                time.sleep(INTERRUPT_RETRY_S)

    def status(self) -> dict:
        """What each actor is doing (see ``ActorThread.status``) and this proc's usage."""
        usage = {}
        try:
            me = psutil.Process()
            with me.oneshot():
                usage = {"rss_bytes": me.memory_info().rss, "cpu_s": round(sum(me.cpu_times()[:2]), 3),
                         "uptime_s": round(time.time() - me.create_time(), 3)}
        except psutil.Error:
            pass
        return {"actors": {name: a.status() for name, a in list(self.actors.items())}, **usage}

    def serve(self) -> None:
        while True:
            try:
                message = wire_frames.decode(sockets.recv_frames(self.inbox), self.guard)
            except wire_frames.BadMessage:
                continue
            try:
                if self.handle(message) == "exit":
                    return
            except Exception as e:  # noqa: BLE001 - a bad request must not end the control loop
                wire_frames.count_dropped()
                print(f"monarch_nb proc {self.proc_id}: dropped a control message it could not handle "
                      f"({type(e).__name__}: {e})", file=sys.stderr)
                header = message.header
                if "reply" in header and "port" in header:
                    try:
                        self._reply(header, ok=False, error=f"{type(e).__name__}: {e}")
                    except Exception:  # noqa: BLE001 - the reply address itself is bad
                        pass

    def _reply(self, header: dict, value=None, **extra) -> None:
        send_reply(self.outbox, self.cluster_id, (header["reply"], header["port"]),
                   header.get("rank", 0), value=value, extra=extra)

    def handle(self, message: wire_frames.Message) -> str | None:
        header = message.header
        op = header["op"]
        if op == "spawn_actor":
            extent = Extent(header["extent"])
            point = extent.point(header["rank"])
            main = bool(header.get("main_thread")) and self.main_work is not None and not any(
                a.on_main_thread for a in self.actors.values())
            actor = ActorThread(self.cluster_id, header["mesh"], point, self.proc_id, message,
                                (header["reply"], header["port"]), self.outbox, main_thread=main,
                                hub=header["reply"] if self.has_hub else None)
            debug_session.on_spawn(self, header)  # the cluster's breakpoints first
            self.actors[header["mesh"]] = actor
            if main:
                self.main_work.put(actor.run)
            actor.start()  # the actor replies once constructed
        elif op in ("stop_actor", "stop_actors"):  # stop_actors: this_proc() acting as its own hub
            actor = self.actors.pop(header.get("mesh") or header.get("name"), None)
            if actor is None or actor.finished.is_set():
                self._reply(header, stopped=True)
            else:
                threading.Thread(target=self._stop_actor, args=(actor, header), daemon=True,
                                 name="monarch-nb-stop").start()
        elif op == "interrupt":
            os.kill(os.getpid(), signal.SIGINT)  # handled on the main thread: see interrupt()
            self._reply(header)
        elif op == "status":
            self._reply(header, **self.status())  # in the header: the hub never unpickles
        elif op in ("torch_env_query", "torch_env_set"):  # ProcMesh.setup_torch_distributed
            self._reply(header, **torch_env.handle(header))
        elif op == "debug":  # breakpoints, paused threads, IDE relays (monarch_nb.debug.session)
            debug_session.handle(self, header)
        elif op == "ping":
            self._reply(header, {"pid": os.getpid(), "actors": sorted(self.actors)})
        elif op == "exit":
            return "exit"
        return None
