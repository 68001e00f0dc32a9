"""``inject_fault``: real faults in chosen ranks of a mesh, for demos, drills and tests of
recovery (TorchFT's and Monarch's fault-tolerance examples inject the same kinds)."""

from __future__ import annotations

from collections.abc import Iterable

from ..client.actor_mesh import ActorMesh
from ..client.allocations import every_host
from ..client.mesh_handle import is_this_proc
from ..client.proc_mesh import ProcMesh
from ..client.runtime import runtime
from ..protocol import envelope, hub_ops, proc_ops, router_ops
from ..wire import frames as wire_frames

FAULTS = {
    proc_ops.FAULT_KILL: "the proc is killed with SIGKILL (a crash, the OOM killer)",
    proc_ops.FAULT_SEGFAULT: "the proc reads address 0 and dies of SIGSEGV (a crash in native code)",
    proc_ops.FAULT_HANG: "the proc is stopped with SIGSTOP: alive, answering nothing (a hung rank, a stuck "
                         "collective); health() calls it unresponsive and calls to it wait",
    proc_ops.FAULT_EXCEPTION: "the endpoints the proc's actors are running raise InjectedFault (an exception "
                              "in a step); an idle proc, and async actors, are left as they are",
    proc_ops.FAULT_HOST: "the proc's host agent is killed with SIGKILL, and with it every proc of that host "
                         "(a machine lost)",
    router_ops.FAULT_ROUTER: "the router of the proc's host fails (an error on its thread, as a bug of its own "
                             "would): the calls it carries then raise ActorError (its cause a SupervisionError: they "
                             "may or may not have run), it starts over, and the host, its procs and their actors "
                             "live on",
}


def inject_fault(mesh: ProcMesh | ActorMesh, kind: str, ranks: Iterable[int] | None = None) -> list[int]:
    """Inflict fault ``kind`` on the procs of ``mesh`` at ``ranks`` (ranks of ``mesh``,
    a slice's own numbering; default: all); for an actor mesh, the procs its actors run
    in. ``kind`` is one of :data:`FAULTS` (``"kill"``, ``"segfault"``, ``"hang"``,
    ``"exception"``, ``"host"``, ``"router"``); each proc (for ``"router"``, each host's
    router) inflicts it on itself, so it is the real fault, seen by supervision and
    callers as if it had happened on its own.

    Non-blocking: returns the ranks the fault was sent to once the messages are sent;
    it lands within milliseconds. What follows is the runtime's: a dead proc's calls
    raise :class:`SupervisionError`, a hung one's wait. ``"host"`` and ``"router"``
    send once per host.

    Raises ``ValueError`` for an unknown ``kind`` (naming the kinds) or a rank outside
    ``0 .. len(mesh) - 1``, and for ``this_proc()`` meshes (the fault would hit this
    client)."""
    if kind not in FAULTS:
        raise ValueError(f"inject_fault: unknown fault {kind!r}; one of: " + ", ".join(map(repr, FAULTS)))
    if is_this_proc(mesh._cluster_id):
        raise ValueError("inject_fault: this_proc()'s proc is this client itself; spawn procs to inject faults in")
    size = len(mesh)
    chosen = list(range(size)) if ranks is None else [int(r) for r in ranks]
    bad = [r for r in chosen if not 0 <= r < size]
    if bad:
        raise ValueError(f"inject_fault: rank(s) {bad} outside this mesh of {size} (ranks 0 .. {size - 1})")
    procs = _procs_of(mesh, chosen)
    header = {envelope.OP: proc_ops.INJECT_FAULT, proc_ops.FAULT: kind}
    rt = runtime()
    if kind in (proc_ops.FAULT_HOST, router_ops.FAULT_ROUTER):
        hosts = {h["host_id"]: h for h in every_host(mesh._hub().request(hub_ops.INFO, timeout=30.0))}
        procs = list({p["host_id"]: p for p in procs}.values())  # one proc per host is enough
        agents = {host_id: host["pid"] for host_id, host in hosts.items()}
    if kind == router_ops.FAULT_ROUTER:
        for proc in procs:
            router = hosts[proc["host_id"]].get(router_ops.ROUTER_ADDRESS)
            if router:  # (an agent that runs none has no router to fail)
                rt.mailbox.send(router, wire_frames.encode(mesh._cluster_id, {envelope.OP: router_ops.INJECT_FAULT}))
        return chosen
    for proc in procs:
        fields = {proc_ops.AGENT_PID: agents[proc["host_id"]]} if kind == proc_ops.FAULT_HOST else {}
        rt.mailbox.send(proc["address"], wire_frames.encode(mesh._cluster_id, {**header, **fields}))
    return chosen


def _procs_of(mesh: ProcMesh | ActorMesh, ranks: list[int]) -> list[dict]:
    """The proc records (address, pid, host_id) under ``ranks`` of ``mesh``."""
    bases = mesh._shape.base_ranks_of(ranks)
    if isinstance(mesh, ProcMesh):
        return [mesh._procs[b] for b in bases]
    info = mesh._hub().request(hub_ops.INFO, timeout=30.0)
    record = info["actor_meshes"][f"{mesh._proc_mesh_name}/{mesh._name}"]
    procs = info["proc_meshes"][mesh._proc_mesh_name]["procs"]
    return [procs[record["proc_ranks"][b]] for b in bases]
