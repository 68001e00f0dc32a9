"""A proc's control loop: spawns and stops actors on the hub's orders.

Control messages (from the hub) arrive on the proc's own inbox; endpoint calls never
pass through here: each actor has its own socket (see ``actor_loop``). Each op
(``protocol.proc_ops``) has its handler in ``ProcServer.ops``; layers above the proc
runtime plug in there and through the server's hooks (the debugger: the ``debug`` op,
``spawn_hooks``, ``endpoint_error_hooks``), so this runtime never imports them.
"""

from __future__ import annotations

import _thread
import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import psutil

from ..mesh import Extent
from ..protocol import envelope, proc_ops
from ..protocol import gpus as gpus_proto
from ..wire import frames as wire_frames
from ..wire import interrupts, sockets
from .actor_loop import ActorThread, send_reply
from . import faults, torch_env, workspace
from .gpus import cuda_in_use


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
        self._workspace = workspace.Synced()  # ProcMesh.sync_workspace: what changed since
        # op -> handler(message), which returns EXIT to end the control loop. A handler
        # that raises (a header missing a key) gets the message counted as dropped.
        self.ops: dict[str, Callable[[wire_frames.Message], str | None]] = {
            proc_ops.SPAWN_ACTOR: self._spawn_actor,
            proc_ops.STOP_ACTOR: self._stop,
            proc_ops.INTERRUPT: self._interrupt,
            proc_ops.STATUS: self._status,
            proc_ops.TORCH_ENV_QUERY: self._torch_env,  # ProcMesh.setup_torch_distributed
            proc_ops.TORCH_ENV_SET: self._torch_env,
            proc_ops.PING: self._ping,
            proc_ops.INJECT_FAULT: self._inject_fault,  # monarch_nb.ft.inject_fault
            proc_ops.SUPERVISE_ACTOR: self._supervise_actor,  # hub.supervision
            proc_ops.SYNC_WORKSPACE: self._sync_workspace,  # ProcMesh.sync_workspace
            proc_ops.EXIT: lambda message: proc_ops.EXIT,
        }
        # Called on the control thread with a spawn_actor header before that actor starts
        # (the debugger applies the cluster's breakpoints first).
        self.spawn_hooks: list[Callable[[dict], None]] = []
        # Called on an actor's thread with (exception, endpoint name) when an endpoint
        # raises, before the error is replied (the debugger's post-mortem).
        self.endpoint_error_hooks: list[Callable[[BaseException, str], None]] = []

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
        if interrupts.refuses(frame):
            return  # paused in the debugger: dropped, not tried again
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
            self.outbox.send(actor.address, wire_frames.encode(self.cluster_id, {envelope.KIND: proc_ops.STOP}))
        self._interrupt_actor(actor)
        stopped = actor.finished.wait(STOP_WAIT_S)
        current = actor.current
        self._reply(header, stopped=stopped, running=None if stopped or current is None else current[0])
        self.outbox.close_thread_sockets()  # this thread ends

    def _interrupt_actor(self, actor: ActorThread) -> None:
        """KeyboardInterrupt into the call ``actor`` is running now, if any (not a later one)."""
        if not actor.busy:
            return
        if actor.on_main_thread:
            self._main_redelivery = True  # only the main thread's actor, not every actor
            os.kill(os.getpid(), signal.SIGINT)  # a real signal: it also ends a blocking call (time.sleep)
        else:
            threading.Thread(target=self._interrupt_threads, args=([(actor, actor.calls)],), daemon=True,
                             name="monarch-nb-interrupt").start()

    def stop_actors_before_exit(self, timeout: float) -> None:
        """Before this proc is terminated: stop its async actors that are running calls,
        so that their calls see ``CancelledError`` and may clean up, and the actors that
        define ``__cleanup__`` (as in Monarch, where stopping a proc stops its actors).
        Waits up to ``timeout`` s."""
        busy = [a for a in list(self.actors.values()) if a.address is not None and not a.finished.is_set()
                and ((a.is_async and a.busy) or a.has_cleanup)]
        for actor in busy:
            actor.stopping = True
            self.outbox.send(actor.address, wire_frames.encode(self.cluster_id, {envelope.KIND: proc_ops.STOP}))
        deadline = time.monotonic() + timeout
        for actor in busy:
            actor.finished.wait(max(0.0, deadline - time.monotonic()))

    def ending(self) -> None:
        """This proc is about to finalize the user's modules and exit: calls still
        running in its actors are answered by nobody (see ``ActorThread.proc_ending``)."""
        for actor in list(self.actors.values()):
            actor.proc_ending = True

    @staticmethod
    def _interrupt_threads(targets: list, exception: type[BaseException] = KeyboardInterrupt) -> None:
        deadline = time.monotonic() + INTERRUPT_FOR_S
        while targets and time.monotonic() < deadline:
            targets = [(a, calls) for a, calls in targets
                       if a.busy and a.calls == calls and not a.interrupt_thread(exception)]
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
        cuda = cuda_in_use()  # (only where CUDA is already up: a status never starts it)
        if cuda is not None:
            usage[gpus_proto.STATUS_CUDA] = cuda
        return {"actors": {name: a.status() for name, a in list(self.actors.items())}, **usage}

    def serve(self) -> None:
        """Handle control messages until an ``exit``. A message that fails verification,
        names no known op or can't be acted on is dropped and counted (with an error
        reply when it asked for one); it never ends this loop."""
        while True:
            try:
                message = wire_frames.decode(sockets.recv_frames(self.inbox), self.guard)
            except wire_frames.BadMessage:
                continue
            try:
                if self.handle(message) == proc_ops.EXIT:
                    return
            except Exception as e:  # noqa: BLE001 - a bad request must not end the control loop
                wire_frames.count_dropped()
                print(f"monarch_nb proc {self.proc_id}: dropped a control message it could not handle "
                      f"({type(e).__name__}: {e})", file=sys.stderr)
                header = message.header
                if envelope.REPLY in header and envelope.PORT in header:
                    try:
                        self._reply(header, ok=False, error=f"{type(e).__name__}: {e}")
                    except Exception:  # noqa: BLE001 - the reply address itself is bad
                        pass

    def _reply(self, header: dict, value=None, **extra) -> None:
        send_reply(self.outbox, self.cluster_id, (header[envelope.REPLY], header[envelope.PORT]),
                   header.get(envelope.RANK, 0), value=value, extra=extra)

    def handle(self, message: wire_frames.Message) -> str | None:
        """Run the handler of ``message``'s op; raises ``ValueError`` for an op with none."""
        op = message.header[envelope.OP]
        handler = self.ops.get(op)
        if handler is None:
            raise ValueError(f"unknown op {op!r}")
        return handler(message)

    def _endpoint_error(self, exc: BaseException, endpoint: str) -> None:
        for hook in self.endpoint_error_hooks:
            hook(exc, endpoint)

    # the ops ---------------------------------------------------------------------------
    def _spawn_actor(self, message: wire_frames.Message) -> None:
        header = message.header
        mesh = header[proc_ops.MESH]
        point = Extent(header[proc_ops.EXTENT]).point(header[envelope.RANK])
        main = bool(header.get(proc_ops.MAIN_THREAD)) and self.main_work is not None and not any(
            a.on_main_thread for a in self.actors.values())
        actor = ActorThread(self.cluster_id, mesh, point, self.proc_id, message,
                            (header[envelope.REPLY], header[envelope.PORT]), self.outbox, main_thread=main,
                            hub=header[envelope.REPLY] if self.has_hub else None,
                            on_endpoint_error=self._endpoint_error, proc_status=self.status)
        for hook in self.spawn_hooks:
            hook(header)
        self.actors[mesh] = actor
        if main:
            self.main_work.put(actor.run)
        actor.start()  # the actor replies once constructed

    def _stop(self, message: wire_frames.Message) -> None:
        header = message.header
        actor = self.actors.pop(header.get(proc_ops.MESH), None)
        if actor is None or actor.finished.is_set():
            self._reply(header, stopped=True)
        else:
            threading.Thread(target=self._stop_actor, args=(actor, header), daemon=True,
                             name="monarch-nb-stop").start()

    def _interrupt(self, message: wire_frames.Message) -> None:
        header = message.header
        actor = self.actors.get(header.get(proc_ops.MESH))
        if proc_ops.MESH not in header:
            os.kill(os.getpid(), signal.SIGINT)  # every actor, handled on the main thread: see interrupt()
        elif actor is not None:
            for address, port in header.get(proc_ops.ROUTES, ()):
                running = actor.cancel((address, port))
                if running is not None and not actor.on_main_thread:
                    threading.Thread(target=self._interrupt_threads, args=([(actor, running)],), daemon=True,
                                     name="monarch-nb-interrupt").start()
                elif running is not None:
                    self._interrupt_actor(actor)
            if actor.is_async:  # its calls run concurrently: every one running now is interrupted
                self._interrupt_actor(actor)
        self._reply(header)

    def _sync_workspace(self, message: wire_frames.Message) -> None:
        header = message.header
        root = Path.cwd()  # a proc runs in its copy of the client's working directory
        if proc_ops.FILES not in header:
            self._reply(header, **{proc_ops.NEED: workspace.needed(root, header[proc_ops.DIGESTS])})
            return
        workspace.write(root, header[proc_ops.FILES])
        changed = set(header[proc_ops.FILES]) | self._workspace.changed(root, header[proc_ops.DIGESTS])
        result: dict = {"reloaded": [], "swapped": [], "problems": []}
        if header.get(proc_ops.RELOAD, True) and changed:
            result = workspace.reload_changed(root, changed, list(self.actors.values()))
        self._reply(header, **{proc_ops.RESULT: result})

    def _inject_fault(self, message: wire_frames.Message) -> None:
        header = message.header
        if header[proc_ops.FAULT] != proc_ops.FAULT_EXCEPTION:
            faults.inflict(header[proc_ops.FAULT], header.get(proc_ops.AGENT_PID))
            return
        targets = [(a, a.calls) for a in list(self.actors.values()) if a.busy and not a.on_main_thread]
        if targets:  # as an interrupt lands, tried again while the same call runs
            threading.Thread(target=self._interrupt_threads, args=(targets, faults.InjectedFault), daemon=True,
                             name="monarch-nb-fault").start()

    def _supervise_actor(self, message: wire_frames.Message) -> None:
        """A mesh an actor here owns failed: the failure goes before that actor's next
        message, and the hub hears at once that it is queued (the callers' errors wait
        for that: ``hub.supervision``), whether or not the actor is busy."""
        header = message.header
        actor = self.actors.get(header[proc_ops.MESH])
        queued = actor is not None and not actor.finished.is_set()
        if queued:
            actor.queue_failure(header[proc_ops.FAILURE], tuple(header[proc_ops.VERDICT]))
        self._reply(header, **{proc_ops.QUEUED: queued})

    def _status(self, message: wire_frames.Message) -> None:
        self._reply(message.header, **self.status())  # in the header: the hub never unpickles

    def _torch_env(self, message: wire_frames.Message) -> None:
        self._reply(message.header, **torch_env.handle(message.header))

    def _ping(self, message: wire_frames.Message) -> None:
        self._reply(message.header, {"pid": os.getpid(), "actors": sorted(self.actors)})
