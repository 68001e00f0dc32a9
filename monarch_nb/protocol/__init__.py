"""The wire vocabulary: every message kind, op name, header key, record layout and
exit cause that crosses a process boundary, in one leaf package.

Hub, host agent, proc, client and debug import these names; nothing else spells wire
vocabulary as a bare string. This package imports nothing of monarch_nb (it is below
``wire/``, which frames and signs what these names describe).

- ``envelope``: the header keys every request and reply carries (op, kind, reply
  address, port, ok, error).
- ``hub_ops``: the ops the hub answers (from clients and host agents).
- ``events``: what the hub sends to clients' event inboxes (health, logs, debug,
  supervision).
- ``records``: the log record layout, exit causes.
- ``agent_ops``: the ops a host agent answers.
- ``proc_ops``: a proc's control ops, and the kinds and header keys of actor messages.
- ``debug``: the debug channel's actions and keys.
- ``rdma_ops``: what a process's RDMA server answers (``monarch_nb.rdma``).
- ``worker_ops``: the attach request a waiting worker answers (``run_worker_loop_forever``).
- ``states``: health states, actor activities, discovery states and failure kinds, as
  ``str``-valued enums (no module outside this package spells them as strings).
- ``health_tree``: the deltas of the health tree the hub pushes to subscribers.

Each name is defined once, by the module of the process that answers it: what a host
agent, a proc or its debugger reports to the hub is a ``hub_ops`` op.
"""
