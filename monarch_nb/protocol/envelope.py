"""The header keys every request and reply carries, whatever plane it travels on.

A request names what it asks for (``OP`` for a control op, ``KIND`` for an actor
message) and, when it wants an answer, where to send it: the requester's inbox
(``REPLY``) and the port that routes the answer to the waiting request (``PORT``). A
reply carries that ``PORT`` back, with ``OK`` and, when it failed, ``ERROR``.
"""

from __future__ import annotations

OP = "op"  # the control op a message asks for (hub, host agent, proc control inbox)
KIND = "k"  # the kind of a message to an actor's own inbox (see proc_ops)
REPLY = "reply"  # the inbox address the answer goes to
PORT = "port"  # routes the answer to the request waiting for it; a reply carries it back
RANK = "rank"  # the answering rank, in a reply; the target rank, in some requests
OK = "ok"  # in a reply: did the request succeed
ERROR = "error"  # in a failed reply: what went wrong, one line
