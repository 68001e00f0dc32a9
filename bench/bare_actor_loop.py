"""A floor for ``bench_fanout_cost.py``, never for use: preloaded by a forkserver
(``MONARCH_NB_PROC_PRELOAD=bare_actor_loop``), it replaces the actor loop of every proc
forked after it with the least a Python actor runtime with signed messages does per
call: receive, verify and decode, call the endpoint, encode and sign the reply, send it.
No supervision, interrupts, cancellation, call chains, output tagging or status; any
message other than a call (a stop) goes to the real loop's handler."""

from __future__ import annotations

from monarch_nb.proc import actor_loop
from monarch_nb.protocol import envelope, proc_ops
from monarch_nb.wire import frames, sockets
from monarch_nb.wire import port as wire_port


def _bare_serve(self, inbox, instance) -> None:
    guard = frames.ReplayGuard()
    while True:
        try:
            message = frames.decode(sockets.recv_frames(inbox), guard)
        except frames.BadMessage:
            continue
        header = message.header
        if header[envelope.KIND] != proc_ops.CALL:
            if self._serve_one(instance, message) == proc_ops.STOP:
                return
            continue
        args, kwargs = message.value()
        result = getattr(instance, header[proc_ops.ENDPOINT])(*args, **kwargs)
        wire_port.deliver(self.outbox, self.cluster_id, header[envelope.REPLY], header[envelope.PORT],
                          self.point.rank, result)


actor_loop.ActorThread._serve = _bare_serve
