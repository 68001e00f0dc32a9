"""The debug channel: the actions of a proc's ``proc_ops.DEBUG`` op and the relay's
messages. What a proc's debugger reports to the hub (``DEBUG_STOPPED``,
``DEBUG_RESUMED``) are ops the hub answers: ``hub_ops``."""

from __future__ import annotations

ACTION = "action"  # header key: which of the actions below a DEBUG op asks for

# Actions the hub sends.
CONFIG = "config"  # the cluster's breakpoints and post-mortem setting (header key CONFIG)
BOUND = "bound"  # CONFIG's reply: [breakpoint id, file] of each breakpoint bound to code the actors there run
STOPS = "stops"  # what is paused here (a recovered hub asks; answered in the header)

# Actions a client sends about one paused thread (header key DAP_THREAD).
WHERE = "where"  # its stack, with source lines
LOCALS = "locals"  # the locals of its top user frame
EVAL = "eval"  # evaluate EXPRESSION in its top user frame
STEP = "step"  # step into; answered when it stops again, or "running" after WAIT_S
NEXT = "next"  # step over; answered as STEP
OUT = "out"  # step out; answered as STEP
CONTINUE = "continue"  # run on (a second continue is harmless)
STEPPING = (STEP, NEXT, OUT)

# Actions of an IDE relay (``debug.relay``), each with header key SESSION.
RELAY_OPEN = "relay_open"  # an IDE connected: a new session, answered to inbox TO
RELAY_DATA = "relay_data"  # DAP bytes from the IDE (DATA)
RELAY_CLOSE = "relay_close"  # the IDE disconnected
RELAY_ALIVE = "relay_alive"  # the relay's heartbeat: the session is kept while they come
RELAY_ACTIONS = (RELAY_OPEN, RELAY_DATA, RELAY_CLOSE, RELAY_ALIVE)
RELAY = "relay"  # kind (``envelope.KIND``) of the proc's messages back to a relay: DAP bytes (DATA)

# Header keys.
DAP_THREAD = "dap_thread"  # the paused thread, by debugpy's thread id
EXPRESSION = "expression"  # EVAL's expression
WAIT_S = "wait_s"  # STEP/NEXT/OUT: how long to wait for the thread to stop again (s)
SESSION = "session"  # the relay session an IDE's bytes belong to
DATA = "data"  # DAP bytes, either way
TO = "to"  # RELAY_OPEN: the relay's inbox
