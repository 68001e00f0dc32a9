"""Entry point of a proc: ``python -m monarch_nb.proc`` (started by a host agent).

This is where a proc process is put together: the runtime (``ProcServer``) and the
debugger above it, which plugs into the server's op table and hooks. It is the one
module of ``proc`` that imports ``debug`` (the import-linter contract names it)."""

from __future__ import annotations

import argparse
import faulthandler
import os
import queue
import signal
import threading
from pathlib import Path

from .. import cluster_dir, lifeline
from ..debug import session as debug_session
from ..protocol import agent_ops, envelope
from ..wire import frames as wire_frames
from ..wire import port as wire_port
from . import actor, finalize, log_prefix, stdio
from .server import ProcServer


CANCEL_ON_TERM_S = 1.0  # how long a terminated proc lets its actors stop (< the agent's grace)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m monarch_nb.proc")
    parser.add_argument("--cluster-dir", required=True)
    parser.add_argument("--agent", required=True, help="host agent inbox address")
    parser.add_argument("--proc-id", required=True)
    parser.add_argument("--ppid", type=int, required=True)
    args = parser.parse_args()

    # A proc never outlives its host agent.
    lifeline.die_with_parent(args.ppid, signal.SIGKILL)
    info = cluster_dir.read_info(Path(args.cluster_dir))
    cluster_id = info["cluster_id"]
    wire_frames.register_key(cluster_id, cluster_dir.key_of(info))
    wire_port.bind_cluster(cluster_id)  # ports unpickled here sign for this cluster

    stdio.install()
    log_prefix.install()  # log records made by an actor name it (Monarch's [actor=...])
    faulthandler.enable()  # a crash (SIGSEGV, abort) leaves its Python stack in the last stderr lines
    actor.set_proc(args.cluster_dir, args.proc_id)  # this_host() in an actor: this cluster
    # The control loop runs on a thread; the main thread runs what must run there (the
    # `%%monarch exec` actor, so that SIGINT can interrupt even its blocking calls).
    main_work: queue.Queue = queue.Queue()
    server = ProcServer(cluster_id, args.proc_id, main_work)
    wire_port.use_outbox(server.outbox)  # ports' values on the sockets the actors' replies take
    debug_session.install(server)  # breakpoint() pauses under debugpy, armed on first use
    signal.signal(signal.SIGINT, lambda _, frame: server.interrupt(frame))
    signal.signal(signal.SIGTERM, lambda *_: _terminate(server))
    os.register_at_fork(after_in_child=_default_signals)
    server.outbox.send(args.agent, wire_frames.encode(
        cluster_id, {envelope.OP: agent_ops.PROC_READY, agent_ops.PROC_ID: args.proc_id, "address": server.address,
                     "pid": os.getpid(), agent_ops.PROC_STATUS: server.status()}))

    def control() -> None:
        try:
            server.serve()
        finally:
            main_work.put(None)

    threading.Thread(target=control, name="monarch-nb-control", daemon=True).start()
    while True:
        try:
            job = main_work.get()
            if job is None:
                break
            job()
        except KeyboardInterrupt:
            continue  # an interrupt that came between two messages
    # Actor threads may be busy in user code; exit without waiting for them, but with
    # what finalization does for user code (atexit, module globals' __del__).
    server.ending()
    finalize.finalize_user_code()
    stdio.flush_all()
    os._exit(0)


def _default_signals() -> None:
    """In a child that an actor's code forked: Python's own SIGINT and SIGTERM handling.
    The proc's would speak for the parent: its SIGTERM handler sends this proc's
    actors stop messages (a parent ending its worker with SIGTERM stopped its own
    actor), and its SIGINT handler interrupts the actors' inherited copies."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _terminate(server: ProcServer) -> None:
    """SIGTERM (the host agent stopping this proc; SIGKILL follows ``STOP_GRACE_S`` later):
    async actors' calls in progress are cancelled and ``__cleanup__`` hooks run first, off
    the signal handler, then ``atexit`` handlers and the user's modules' finalizers
    (``finalize``), then the proc dies of the SIGTERM as before (its exit status
    unchanged)."""
    # Here, in the main thread (the handler runs there): only it may set handlers. A
    # second SIGTERM meanwhile ends the proc at once.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def cancel_then_die() -> None:
        try:
            server.stop_actors_before_exit(CANCEL_ON_TERM_S)
            server.ending()
            finalize.finalize_user_code()
            stdio.flush_all()
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=cancel_then_die, name="monarch-nb-terminate", daemon=True).start()


if __name__ == "__main__":
    main()
