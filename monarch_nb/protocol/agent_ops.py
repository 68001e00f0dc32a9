"""The ops a host agent answers, and their header keys.

What an agent reports to the hub (``AGENT_READY``, ``PROC_EXITED``, ``LOG_LINES``...)
are ops the hub answers: ``hub_ops``."""

from __future__ import annotations

# Ops a host agent answers (header key ``envelope.OP``).
HUB_ALIVE = "hub_alive"  # the hub's heartbeat: keeps the agent's grace period from running out
ADOPT = "adopt"  # a (restarted) hub takes this agent over; answered with its procs and exit codes
SPAWN_PROCS = "spawn_procs"  # start procs PROC_IDS at once; answered when every one reported ready
STOP_PROCS = "stop_procs"  # SIGTERM, then SIGKILL, procs PROC_IDS; answered when all exited
SHUTDOWN = "shutdown"  # stop every proc and exit
DRAIN_LOGS = "drain_logs"  # answered once every line written before it went to the hub
PROC_READY = "proc_ready"  # from a proc it started: bound, with its address and pid
# Ask procs PROC_IDS of this host for their status now; answered with them under
# hub_ops.AGENT_STATUSES, as a heartbeat carries them (health() with statuses gone stale)
ASK_STATUSES = "ask_statuses"

# Ops that come from the hub: each shows it is alive.
FROM_HUB = (HUB_ALIVE, ADOPT, SPAWN_PROCS, STOP_PROCS, SHUTDOWN, DRAIN_LOGS, ASK_STATUSES)

# Header keys of these ops.
HOST_ID = "host_id"  # the agent's index in the hosts dimension, as the hub named it
PROC_ID = "proc_id"  # one proc, ``MESH/RANK``
PROC_IDS = "proc_ids"  # the procs a spawn or stop concerns
HUB = "hub"  # ADOPT: the address of the hub that takes the agent over
WANT_STATUSES = "want_statuses"  # HUB_ALIVE: someone watches health: ask the procs, fold it into heartbeats
HUB_PID = "hub_pid"  # HUB_ALIVE: the hub's process, which an agent on its machine watches for CPU waits
HUB_HOSTNAME = "hub_hostname"  # HUB_ALIVE: the hub's machine (socket.gethostname())
# HUB_ALIVE: the routers of the hosts lost now: what a router would send through one of
# them as a relay (a port's values for a client) goes straight to the client instead
ROUTERS_LOST = "routers_lost"
# PROC_READY: the proc's status as it starts (proc_ops.STATUS's answer), passed on to the
# hub in SPAWN_PROCS's reply (hub_ops.AGENT_STATUSES): a health() right after a spawn
# needs to ask no proc
PROC_STATUS = "proc_status"
