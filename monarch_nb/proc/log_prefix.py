"""Python ``logging`` records made by an actor name it, as in Monarch:
``[actor=module.Class mesh{'gpus': 0/2}] message``.

A proc's printed lines are attributed to their actor by ``stdio``, but a log handler
may write elsewhere (a file, a socket, a log service), where only the message itself
can say who wrote it; programs written for Monarch read that prefix there. It is set
on the record when it is made (the proc's record factory), so every handler sees it,
including handlers added later. Records made outside an actor's call (the proc's own
threads) are left alone, and so are empty messages: torch.compile's structured trace
logging requires its messages to stay empty.
"""

from __future__ import annotations

import logging

from ..errors import actor_name
from .actor import current_context


def install() -> None:
    """Make this proc's log records carry the actor that made them (once per proc)."""
    make_record = logging.getLogRecordFactory()

    def record_with_actor(*args, **kwargs) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        ctx = current_context()
        if ctx is not None and isinstance(record.msg, str) and record.msg:
            who = ctx.actor_instance
            name = actor_name(who.class_name, who.mesh_name, dict(who.rank.extent), who.rank.rank)
            record.msg = f"[actor={name}] {record.msg}"
        return record

    logging.setLogRecordFactory(record_with_actor)
