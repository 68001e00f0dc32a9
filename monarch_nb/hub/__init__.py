"""The hub: one daemon per cluster (``python -m monarch_nb.hub``), its control plane.

It gets hosts from the allocator and keeps their host agents, the registry of proc
and actor meshes (and the state file that lets a restarted hub re-adopt them), the
connected clients, every log line, supervision and the debug registry. It is what
makes a cluster outlive a client. It is never on the data plane: endpoint calls go
straight from client to proc.

May import: ``mesh``, ``protocol``, ``wire``, ``allocators``, ``cluster_dir``,
``lifeline``, ``errors`` and the standard library; never client, notebook or
debug-client code (nothing runs in the hub that only a client needs).

The hub is a set of services, each constructed with only what it uses (another
service is passed in, never reached for); ``server.Hub`` builds them, owns the event
loop, the ``AioEndpoint`` and the op table (op name -> the handler of the service that
answers it; op names in ``protocol.hub_ops``, events in ``protocol.events``):

- ``server``: ``Hub``: lifecycle (start, recover, shutdown), the receive loop
  (malformed messages answered and counted), the heartbeat loop, the op table, and the
  ops ``info`` and ``shutdown``.
- ``registry``: ``Registry``: hosts, proc meshes, actor meshes, constructor payloads,
  and the state file (``state``) written on every change; records in ``records``.
- ``clients``: ``Clients``: connected clients, their presence and the idle time.
- ``announce``: ``Announcer``: events to every client's event inbox.
- ``heartbeats``: ``Heartbeats``: liveness of host agents and clients, stall detection.
- ``allocation``: ``Allocation``: hosts from the allocator (or adopted from a dead
  hub), allocations ended from outside.
- ``launcher``: ``ProcLauncher``: procs started and stopped through host agents.
- ``mesh_ops``: ``MeshOps``: spawn and stop proc and actor meshes, actors gone,
  orphaned meshes stopped.
- ``supervision``: ``Supervision``: proc exits, lost and failed hosts, failures
  escalated to owners or clients.
- ``restarts``: ``Restarts``: failed procs restarted with their actors.
- ``log_ops``: ``LogOps``: lines stored (``logstore``), forwarded, flushed, queried.
- ``debug_ops``: ``DebugRegistry``: paused ranks, breakpoints, post-mortem mode.
- ``health``: ``Health``: the health tree.

Who uses whom (lower ones know nothing of higher ones): ``Clients`` < ``Announcer`` <
``Registry`` < ``ProcLauncher``, ``LogOps``, ``DebugRegistry`` < ``MeshOps`` <
``Supervision`` < ``Restarts``, ``Allocation``, ``Heartbeats`` < ``Health``, ``Hub``.
"""
