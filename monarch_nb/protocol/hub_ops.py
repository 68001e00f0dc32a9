"""The ops the hub answers: the ``op`` field of a request (or one-way message) sent to
the hub's inbox, by clients, host agents and procs.

A request carries ``op``, ``port`` and ``reply``; the hub's reply carries ``ok`` and
either the result fields or ``error`` and ``error_type``. One-way messages (marked
below) get no reply.
"""

from __future__ import annotations

import os

# from host agents -----------------------------------------------------------------------
AGENT_READY = "agent_ready"  # one-way: a started host agent reports its address, pid and host
AGENT_ALIVE = "agent_alive"  # one-way: a host agent's heartbeat (with its count of dropped frames)
AGENT_EXITING = "agent_exiting"  # a host agent stops on a signal not from the hub: fail its host first
PROC_UP = "proc_up"  # one-way: one proc of a spawn has started (spawn progress)
PROC_EXITED = "proc_exited"  # one-way: a proc exited (its pid and return code)
LOG_LINES = "log_lines"  # one-way: a batch of lines the host's procs printed, handled in arrival order

# from procs -------------------------------------------------------------------------------
ACTOR_FAILED = "actor_failed"  # one-way: a ``broadcast`` endpoint raised (nobody to reply to), or an actor died
DEBUG_STOPPED = "debug_stopped"  # one-way: a thread of a proc stopped in the debugger
DEBUG_RESUMED = "debug_resumed"  # one-way: threads of a proc run again (their stop keys)

# Header keys of ACTOR_FAILED (with proc_ops.MESH, envelope.RANK and envelope.ERROR).
FAILED_ENDPOINT = "endpoint"  # the endpoint that raised
FAILED_TRACEBACK = "traceback"  # the remote traceback
ACTOR_DEAD = "dead"  # the actor died (see proc.actor_loop): it fails every later call
FAILED_CAUSE = "cause"  # with ACTOR_DEAD: why it died, e.g. "train raised ValueError: bad batch"

# from clients: presence -----------------------------------------------------------------
CLIENT_ALIVE = "client_alive"  # one-way: a client's heartbeat (and where it wants events)
CLIENT_BYE = "client_bye"  # one-way: a client disconnects

# from clients: the cluster ----------------------------------------------------------------
INFO = "info"  # the cluster's configuration, hosts, clients and registry
# INFO: {"proc_meshes": [name, ...], "actor_meshes": [key, ...]}: only those meshes (and
# the proc meshes of those actor meshes), not every mesh of the cluster: a first call,
# a spawn or an interrupt asks of its own meshes only
INFO_OF = "of"
HEALTH = "health"  # the health tree (hosts -> procs -> actors, with states)
SHUTDOWN = "shutdown"  # stop every proc and host agent, then the hub; replied to once all stopped
ALLOCATE = "allocate"  # more hosts, from an allocation of their own (a Slurm job); replied once they report
RELEASE = "release"  # stop an added allocation's procs and host agents, and end the allocation
# Fields of ALLOCATE and RELEASE: the allocation's name, ALLOCATE's allocator spec and
# host count; ALLOCATE's reply: the new hosts' ids (HOSTS), in ``hosts``-dimension order.
ALLOCATION = "allocation"
ALLOCATOR_SPEC = "allocator"
HOST_COUNT = "host_count"
# RELEASE's: give the allocation back only if it is still starting (an interrupted
# ALLOCATE's own); otherwise nothing happens.
STARTING_ONLY = "starting_only"
HOSTS = "hosts"

# from clients (and actors that spawn meshes): meshes -------------------------------------
SPAWN_PROCS = "spawn_procs"  # start a proc mesh on the hosts
# Procs one spawn may start on each host: more is a mistake (a typo'd size), not a
# workload, and would have the hub and host agent build tables they can't hold. The
# environment variable raises it for a host that really runs more.
MAX_PROCS_PER_HOST = 1024
MAX_PROCS_PER_HOST_ENV = "MONARCH_NB_MAX_PROCS_PER_HOST"


def check_procs_per_host(per_host: dict, count: int) -> None:
    """Raise ``ValueError`` when ``count`` procs per host (from ``per_host``) exceed
    ``MAX_PROCS_PER_HOST`` (or ``$MONARCH_NB_MAX_PROCS_PER_HOST``)."""
    limit = int(os.environ.get(MAX_PROCS_PER_HOST_ENV) or MAX_PROCS_PER_HOST)
    if count > limit:
        raise ValueError(f"per_host={per_host} asks for {count:,} procs on each host, more than the {limit:,} "
                         f"a spawn may start; check the sizes, or set {MAX_PROCS_PER_HOST_ENV} for a host "
                         "that really runs more")
HOST_EXTENT = "host_extent"  # spawn_procs field: the host mesh's extent ({} for one host), which the procs' extends
# spawn_procs field: each proc's own environment in rank order (bootstrap_command), set
# over its GPU binding
RANK_ENV = "rank_env"
SPAWN_PROGRESS = "spawn_progress"  # how many procs of a spawn have started so far
SPAWN_ACTORS = "spawn_actors"  # construct an actor mesh on a proc mesh (payload: class and arguments)
SPAWN_DIGESTS = "digests"  # SPAWN_ACTORS: {"code", "args"} of the construction (client.spawn_digest), kept
# SPAWN_ACTORS: the client calls this mesh through the host routers: each actor
# connects to its host's router and announces itself there (proc_ops.ANNOUNCE)
ROUTED = "routed"
RAISE_INIT_ERRORS = "raise_init_errors"  # SPAWN_ACTORS: fail the spawn when an __init__ raises (else a fault)
INIT_FAILED = "init_failed"  # SPAWN_ACTORS reply: ranks of the new mesh whose __init__ raised (faults sent as events)
STOP_ACTORS = "stop_actors"  # stop an actor mesh (or interrupt one still being constructed)
STOP_PROCS = "stop_procs"  # stop a proc mesh and its actors
RESTART_PROCS = "restart_procs"  # new procs in place of failed (or named) ranks, with their actors
SET_RANK_ENV = "set_rank_env"  # variables set in procs since their start, for their restarts

# from clients: logs ---------------------------------------------------------------------
LOGS_FLUSH = "logs_flush"  # forward every line printed before this request, then reply
# LOGS_FLUSH's answer: the hosts (hostname, or host id) whose agents did not drain their
# procs' pipes within the flush's wait: their lines may come after it
UNDRAINED = "undrained"
LOGS_QUERY = "logs_query"  # stored log records matching filters

# from clients: the debugger ---------------------------------------------------------------
DEBUG_PAUSED = "debug_paused"  # every thread paused in the debugger
DEBUG_SET_BREAKPOINT = "debug_set_breakpoint"  # add a cluster breakpoint (file, line, mesh, ranks, condition)
BREAKPOINT_FUNCTION = "function"  # DEBUG_SET_BREAKPOINT: the function it is in (debug.binding.identity), kept with it
DEBUG_BREAKPOINTS = "debug_breakpoints"  # the cluster's breakpoints and post-mortem setting
DEBUG_CLEAR_BREAKPOINTS = "debug_clear_breakpoints"  # remove breakpoints by id (or all)
DEBUG_POST_MORTEM = "debug_post_mortem"  # switch post-mortem pausing on raising endpoints on or off
DEBUG_RELAY_REFUSED = "debug_relay_refused"  # one-way: a client's IDE relay refused a connection of another user
REFUSED_UID = "peer_uid"  # DEBUG_RELAY_REFUSED: the uid that connected (None: it could not be found)
REFUSED_PORT = "relay_port"  # DEBUG_RELAY_REFUSED: the relay's port

# from clients: the health tree, pushed -----------------------------------------------------
HEALTH_SUBSCRIBE = "health_subscribe"  # the tree now (TREE, TREE_SEQ); then HEALTH_DELTA events to the client
HEALTH_UNSUBSCRIBE = "health_unsubscribe"  # one-way: no more HEALTH_DELTA events for this subscription
SUBSCRIPTION = "subscription"  # HEALTH_SUBSCRIBE/UNSUBSCRIBE: the subscriber's id (one per feed of a client)
CLIENT_ID = "client_id"  # HEALTH_SUBSCRIBE: the client the subscription ends with
EVENT_INBOX = "event_inbox"  # HEALTH_SUBSCRIBE: the client's event inbox, where the deltas go
VOLATILE_EVERY_S = "volatile_every_s"  # HEALTH_SUBSCRIBE: send memory/CPU/uptime/busy-for at most this often
TREE = "tree"  # HEALTH_SUBSCRIBE's reply: the whole tree
TREE_SEQ = "tree_seq"  # HEALTH_SUBSCRIBE's reply and HEALTH_DELTA: the tree's version for this subscription

# Header key of AGENT_ALIVE: the status of the agent's procs, asked by the agent since its
# last heartbeat: proc id -> [seconds since it was asked, its answer to proc_ops.STATUS
# (None: no answer within a second), the proc's control address asked].
AGENT_STATUSES = "statuses"
