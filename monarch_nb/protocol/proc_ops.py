"""A proc's conversation: the ops its control inbox answers, and the kinds and header
keys of messages to an actor's own inbox.

What a proc reports to the hub (``ACTOR_FAILED``, its debugger's stops) are ops the hub
answers: ``hub_ops``."""

from __future__ import annotations

# Ops a proc's control inbox answers (header key ``envelope.OP``).
SPAWN_ACTOR = "spawn_actor"  # construct one actor (MESH at RANK of EXTENT); answered once constructed
STOP_ACTOR = "stop_actor"  # stop the actor of mesh MESH; answered when its thread ended (or not)
INTERRUPT = "interrupt"  # KeyboardInterrupt into the endpoints running here; with MESH and ROUTES: only
#   those calls of that mesh's actor (refused if they have not begun)
STATUS = "status"  # what each actor is doing, and the proc's usage (in the reply's header)
TORCH_ENV_QUERY = "torch_env_query"  # the torch elastic variables here (ProcMesh.setup_torch_distributed)
TORCH_ENV_SET = "torch_env_set"  # set them, then answer as TORCH_ENV_QUERY
DEBUG = "debug"  # a debugger request (protocol.debug's actions)
PING = "ping"  # answered with the pid and the actors here
SYNC_WORKSPACE = "sync_workspace"  # DIGESTS of the client's workspace: answered with NEED (the files this
#   proc's copy lacks); with FILES too, write them, then (RELOAD) reload what changed: answered with RESULT
INJECT_FAULT = "inject_fault"  # inflict FAULT (one of FAULT_KINDS) on this proc; never answered
SUPERVISE_ACTOR = "supervise_actor"  # put FAILURE before the next message of mesh MESH's actor (its
#   __supervise__ runs first); answered at once with QUEUED; the verdict goes to VERDICT as SUPERVISE's reply
EXIT = "exit"  # end the control loop (the proc exits)

# Header keys of control ops.
MESH = "mesh"  # the actor mesh an op concerns
ROUTES = "routes"  # INTERRUPT: the reply routes [address, port] of the calls to interrupt
PROC = "proc"  # ACTOR_FAILED: the proc id (PROC_MESH/RANK): names an actor mesh only with MESH
EXTENT = "extent"  # the actor mesh's extent, in SPAWN_ACTOR
MAIN_THREAD = "main_thread"  # SPAWN_ACTOR: run the actor on the proc's main thread (%%monarch exec)
PREFER = "prefer"  # SPAWN_ACTOR: the address a restarted actor takes back when free
CALLER = "caller"  # SPAWN_ACTOR, CONNECT: a caller's inbox, which the actor connects to ahead of its replies
# SPAWN_ACTOR: once its inbox is bound, before its __init__ runs, the actor tells CALLER
# its ADDRESS and PROC in an ACTOR_BOUND message (with this as PORT when it is an int: a
# client's), so that CALLER connects to it while the constructors run, not on the first
# call (which waited ~100 ms for 256 handshakes direct, ~250 ms through 32 routers)
ANNOUNCE = "announce"
ACTOR_BOUND = "actor_bound"  # the op of that message; never answered
DEBUG_CONFIG = "debug"  # SPAWN_ACTOR: the cluster's breakpoints, applied before the actor starts
DIGESTS = "digests"  # SYNC_WORKSPACE: {path relative to the workspace: sha256 hex} of its .py files
FILES = "files"  # SYNC_WORKSPACE: {relative path: contents} of the files a proc said it needs
RELOAD = "reload"  # SYNC_WORKSPACE: reload the modules whose files changed
NEED = "need"  # SYNC_WORKSPACE's reply: the relative paths this proc's copy lacks or holds otherwise
RESULT = "result"  # SYNC_WORKSPACE's reply: {"reloaded", "swapped", "problems"} (proc.workspace)
FAULT = "fault"  # INJECT_FAULT: which fault
AGENT_PID = "agent_pid"  # INJECT_FAULT of FAULT_HOST: the pid of the proc's host agent, to kill
VERDICT = "verdict"  # SUPERVISE_ACTOR: the [address, port] the actor's verdict goes to
QUEUED = "queued"  # SUPERVISE_ACTOR's reply: the actor is here and will take the failure next
# CALL from a host router: [the router's address, the calling client's(, the relay router
# the call came through)]: the client's ports among the arguments send through the
# router (and that relay), as the call's replies do (wire.port)
VIA = "via"
INIT_FAULT = "init_fault"  # SPAWN_ACTOR: an __init__ that raises leaves a dead actor answering calls (Monarch)

# The faults INJECT_FAULT inflicts (monarch_nb.ft.inject_fault says what each does).
FAULT_KILL = "kill"
FAULT_SEGFAULT = "segfault"
FAULT_HANG = "hang"
FAULT_EXCEPTION = "exception"
FAULT_HOST = "host"
FAULT_KINDS = (FAULT_KILL, FAULT_SEGFAULT, FAULT_HANG, FAULT_EXCEPTION, FAULT_HOST)

# Kinds of messages to an actor's own inbox (header key ``envelope.KIND``).
CALL = "call"  # call endpoint ENDPOINT; the body holds (args, kwargs)
SUPERVISE = "supervise"  # a mesh this actor spawned failed (FAILURE): may __supervise__ handle it?
STOP = "stop"  # end the actor's message loop (sent by its proc's STOP_ACTOR)
WAKE = "wake"  # its proc queued a failure for it (SUPERVISE_ACTOR): take it now if idle
CONNECT = "connect"  # connect to CALLER (a client that picked its mesh), where its calls' replies go; never answered

# Header keys of actor messages.
ENDPOINT = "ep"  # the endpoint a CALL is for
ORIGIN = "o"  # ``CLIENT_ID:...`` of the call that caused this message: where its output is shown
VIEW = "vw"  # CALL: the mesh or slice it was sent to (``Shape.spec``): the receiver's ``message_rank`` is its point there
CHAIN = "w"  # CALL: the actors held up waiting along the calls that led to it (proc.call_chain)
FAILURE = "failure"  # SUPERVISE: the failure event
HANDLED = "handled"  # SUPERVISE's reply: did __supervise__ handle it
OWNER_DIED = "owner_died"  # SUPERVISE's reply: unhandled, it killed the owner, whose death carries it up
ADDRESS = "address"  # SPAWN_ACTOR's reply: the actor's inbox
TRACEBACK = "traceback"  # SPAWN_ACTOR's failed reply: the remote traceback (with ERROR)
DIED = "supervision"  # a CALL's failed reply: the actor is dead (the client raises SupervisionError)
ALONE = "alone"  # with DIED, and in ACTORS_GONE: the actor died, its proc lives on (an endpoint raised a BaseException)
GRACE_OVER = "grace_over"  # to a call's own reply port, from its caller: stop waiting on the ranks still out after one died
