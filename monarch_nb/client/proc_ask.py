"""Control requests to every proc of a mesh at once (torch.distributed set-up, workspace
sync), answered by the procs' control loops; the hub is not on this path."""

from __future__ import annotations

import time
from typing import Any

from ..errors import ClusterError, SupervisionError
from ..protocol.records import exit_cause
from ..wire.mailbox import Gather
from .runtime import runtime

# ``mesh`` below is a ``proc_mesh.ProcMesh`` (not imported: that module imports this
# one's users).
CHECK_S = 1.0  # while procs have not answered, how often to ask the hub whether they exited


def ask(mesh: Any, headers: list[dict], timeout: float, needs_all: str) -> list[dict]:
    """Send ``headers[i]`` to the proc of rank i, all at once; their reply headers in
    rank order. Raises :class:`SupervisionError` as soon as the hub knows that a proc
    that has not answered exited (its text ends with ``needs_all``: why every proc must
    answer), and :class:`ClusterError` naming the procs that did not answer within
    ``timeout`` seconds."""
    procs = [mesh._procs[r] for r in mesh._shape.base_ranks()]
    with Gather(runtime().mailbox) as gather:  # the loops in a function of their own: see monarch_nb.wire.interrupts
        replies = _gathered(gather, mesh, procs, headers, timeout, needs_all)
    missing = [f"rank {r} (proc {p['proc_id']}, pid {p['pid']})" for r, p in enumerate(procs) if r not in replies]
    if missing:
        raise ClusterError(f"proc mesh {mesh.name!r}: {', '.join(missing)} did not answer within {timeout} s; "
                           "see cluster.health()")
    return [replies[r] for r in range(len(procs))]


def _gathered(gather: Gather, mesh: Any, procs: list[dict], headers: list[dict], timeout: float,
              needs_all: str) -> dict:
    """Send ``headers`` through ``gather`` and wait up to ``timeout`` seconds: the reply
    headers that came, by rank."""
    for rank, (proc, header) in enumerate(zip(procs, headers)):
        gather.request(proc["address"], mesh._cluster_id, header, key=rank)
    deadline = time.monotonic() + timeout
    while not gather.wait(len(procs), min(CHECK_S, deadline - time.monotonic())):
        _raise_if_exited(mesh, procs, gather.replies, needs_all)
        if time.monotonic() >= deadline:
            break
    return {rank: message.header for rank, message in gather.replies.items()}


def _raise_if_exited(mesh: Any, procs: list[dict], replies: dict, needs_all: str) -> None:
    """:class:`SupervisionError` naming the procs without a reply that the registry
    shows exited."""
    try:
        record = mesh._control().proc_mesh_record(mesh.name) or {}
    except ClusterError:
        return
    known = {(p["proc_id"], p["pid"]): p["exit_code"] for p in record.get("procs", [])}
    gone = []
    for r, p in enumerate(procs):
        if r in replies:
            continue
        key = (p["proc_id"], p["pid"])
        if key not in known:  # the mesh was stopped (or stopped and spawned again)
            gone.append(f"rank {r} (proc {p['proc_id']}, pid {p['pid']}) was stopped")
        elif known[key] is not None:
            gone.append(f"rank {r} (proc {p['proc_id']}, pid {p['pid']}) {exit_cause(known[key])}")
    if gone:
        raise SupervisionError(f"proc mesh {mesh.name!r}: {', '.join(gone)}; {needs_all}")
