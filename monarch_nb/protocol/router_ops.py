"""A host router's conversation (``host.router``): the one message per host a call over
a mesh that spans hosts leaves the client as, and the batches of replies that come back.

A client sends ``CAST`` to the router of each host its call reaches, naming the
destination actors of that host (``TARGETS``) and the call's own header (``CALL``); the
body and buffers are the call's arguments, pickled once. The router sends the call to
each local actor with itself as reply-to and the client's route as the port, and sends
the replies back to the client in batches: one message holding the headers of several
replies (``BATCH``) and their bodies one after another (``LENGTHS`` bytes each). With
``REDUCE``, the router folds the values that succeeded into one reply naming every rank
it covers (``FOLDED``).

Relaying (one message per call at the client, whatever the hosts): a client may send
one ``CAST`` to one router, its *relay*, naming the destinations of the other hosts by
their routers (``RELAY``). The relay passes the cast on to each of those routers as
itself (``UPSTREAM``: its own address), and they send their batches for that client
to the relay (``FOR``: the client), which sends them on with its own, joining replies
that are byte for byte alike across hosts (``SAME``). A client relays all of its routed
calls of a cluster through one relay, so every call to an actor takes one path.
"""

from __future__ import annotations

# Ops a router answers (header key ``envelope.OP``).
CAST = "cast"  # deliver CALL to the actors TARGETS of this host; never answered itself
# Pass proc_ops.INTERRUPT (MESH, and each proc's ROUTES) on to the procs PROCS of this
# host at once; answered once every one answered, or after TIMEOUT s, naming those that
# did not (MISSED): a Ctrl-C over a routed mesh costs the client one message per host
INTERRUPT = "interrupt"
# Fail this router's thread with an error of its own (``monarch_nb.ft.inject_fault``'s
# FAULT_ROUTER, for drills and tests of its recovery); never answered
INJECT_FAULT = "inject_fault"
FAULT_ROUTER = "router"  # the fault kind that sends INJECT_FAULT to a host's router

# hub_ops.AGENT_READY field: the address of the host's router (HostRecord.router).
ROUTER_ADDRESS = "router"

# Header keys of CAST.
TARGETS = "targets"  # [[actor address, base rank, proc id], ...]: the destinations on this host
CALL = "call"  # the call's header as an actor takes it (kind, endpoint, origin, reply, port)
REDUCE = "reduce"  # a pickled associative function (a, b) -> value: fold the values here
# (a router that can't unpickle it passes the values on, for the client to fold)
CLIENT = "client"  # the calling client's inbox (its ports' values go back through the router)
# The caller takes identical replies as one (SAME): a call's own replies, waited on as a
# whole (not a port's values, whose order with the replies matters to the receiver).
COALESCE = "coalesce"
# {router address: TARGETS of that router's host}: pass this cast on to each (as this
# router), and their replies back to the client through this one
RELAY = "relay"
# In a cast a relay passed on: the relay's address; what goes to CLIENT goes there instead
UPSTREAM = "upstream"

# Header keys of INTERRUPT, and of its answer.
PROCS = "procs"  # [[a proc's control address, [the routes of its calls to interrupt]], ...]
TIMEOUT = "timeout"  # seconds the router waits for the procs' answers (at most INTERRUPT_WAIT_MAX_S)
MISSED = "missed"  # the answer: the control addresses of the procs that did not answer in time
INTERRUPT_WAIT_MAX_S = 10.0

# Header keys of a batch of replies (sent to the client's mailbox, with envelope.PORT).
BATCH = "batch"  # [reply header, ...]: each as the actor sent it, less the port
LENGTHS = "lengths"  # the byte length of each reply's body, in the order of BATCH
FOR = "for"  # in a batch (or a lone reply) sent to a relay: the client it goes on to
# In a failure a client sends itself: its relay was lost (its host), and every rank of the
# call still out with it (their replies would have come back through it)
RELAY_LOST = "relay_lost"
FOLDED = "folded"  # in a reply header: the base ranks whose values this one value folds
# In a failure's header: the reducer raised (or its value could not be pickled) while it
# folded this rank's value: the reduce fails with that error, as a fold in the client would,
# not the rank
FOLD_FAILED = "fold_failed"
# In a reply header: the other base ranks whose replies were this one, header and body
# byte for byte (a train step's None, a shared flag), each to be taken as if it had come
SAME = "same"

# How a client picks the transport of a call (``MONARCH_NB_ROUTER``): never through
# routers, always when a mesh spans two hosts or more, or from a number of actors on.
ROUTER_ENV = "MONARCH_NB_ROUTER"
ROUTER_OFF = "off"
ROUTER_ON = "on"
# Whether a client sends each routed call to one relay router (on) or to every host's
# router itself (off, the default).
RELAY_ENV = "MONARCH_NB_ROUTER_RELAY"
