"""Blocking control requests from a client (or an actor) to the hub, and the hub as
the control plane of mesh handles (:class:`HubControl`)."""

from __future__ import annotations

from typing import Callable

from ..errors import ClusterError, HubTimeout, InvalidRequest
from ..mesh import Extent
from ..protocol import envelope, hub_ops, proc_ops, router_ops
from ..wire import sockets
from ..wire.mailbox import Gather
from .control import ControlPlane, init_error
from .runtime import runtime

# The hub names the kind of error; the client raises the matching type.
_ERROR_TYPES = {"ValueError": InvalidRequest, "ClusterError": ClusterError}


def watch_hub(address: str, check: Callable[[], None]) -> None:
    """Make requests to the hub at ``address`` give up early when ``check`` raises."""
    runtime().hub_liveness[address] = check


class HubClient:
    """Sends one request at a time per call and waits for the hub's reply."""

    def __init__(self, cluster_id: str, address: str):
        self.cluster_id = cluster_id
        self.address = address

    def request(self, op: str, body: bytes | None = None, buffers=(), timeout: float | None = 120.0,
                while_waiting: Callable[[], None] | None = None, **fields) -> dict:
        """Run ``op`` on the hub; returns the reply header.

        The reply header's routing fields (``port``, ``ok``) are removed.
        Raises :class:`InvalidRequest` (a ``ValueError``) for a request the hub refused
        as bad input, :class:`ClusterError` when the hub failed or died (known within
        about a second for a hub on this machine), :class:`HubTimeout` (a
        ``ClusterError`` and ``TimeoutError``) when it did not answer within ``timeout``
        seconds (``None``: no limit). ``while_waiting`` runs about twice a second until
        the reply comes (progress)."""
        alive = runtime().hub_liveness.get(self.address)

        def check() -> None:
            if alive is not None:
                try:
                    alive()
                except ClusterError:
                    # The request waits in our socket's queue; a hub recovered at this
                    # address would run it after we told the caller it failed.
                    sockets.Outbox.discard(self.address)
                    raise
            if while_waiting is not None:
                while_waiting()

        reply = runtime().mailbox.request(self.address, self.cluster_id, {envelope.OP: op, **fields}, body,
                                        buffers, timeout, check=check)
        if reply is None:
            raise HubTimeout(f"the hub at {self.address} did not answer {op!r} within {timeout} s; "
                               "is the cluster still running?")
        header = reply.header
        if not header.get(envelope.OK):
            raise _ERROR_TYPES.get(header.get("error_type"), ClusterError)(header[envelope.ERROR])
        return {k: v for k, v in header.items() if k not in (envelope.PORT, envelope.OK)}


# Of the time a client waits for an interrupt's confirmations, the share a host router
# waits for its procs' before it answers, naming those that did not: the rest is for that
# answer to reach the client. Given the whole, the answer came once the client had
# stopped waiting, and every proc behind that router was counted unconfirmed.
ROUTER_WAIT_SHARE = 0.8


class HubControl(ControlPlane):
    """The control plane of a cluster: its hub."""

    def __init__(self, cluster_id: str, hub_address: str):
        self.cluster_id = cluster_id
        self.hub = HubClient(cluster_id, hub_address)

    def spawn_actors(self, proc_mesh, proc_ranks, name, fields, body, buffers, timeout, while_waiting) -> dict:
        return self.hub.request(hub_ops.SPAWN_ACTORS, body, buffers, timeout=timeout, while_waiting=while_waiting,
                                name=name, proc_mesh=proc_mesh, proc_ranks=proc_ranks, **fields)

    def stop_actors(self, proc_mesh: str, name: str, timeout: float | None = None) -> list[dict]:
        reply = self.hub.request(hub_ops.STOP_ACTORS, timeout=120.0 if timeout is None else timeout, proc_mesh=proc_mesh,
                                 name=name)
        return reply.get("stuck") or []

    def stop_procs(self, name: str) -> None:
        self.hub.request(hub_ops.STOP_PROCS, name=name)

    def restart_procs(self, proc_mesh: str, proc_ranks: list[int] | None, timeout: float) -> dict:
        rt = runtime()  # (calls queued for the dead were dropped when the hub said they died)
        reply = self.hub.request(hub_ops.RESTART_PROCS, timeout=timeout, name=proc_mesh, ranks=proc_ranks)
        for record in reply["actor_meshes"].values():
            rt.supervision.sync(self.cluster_id, record["addresses"], record["dead"], record["name"])
            rt.supervision.clear_pending(self.cluster_id, record["name"])
        for handle in list(rt.proc_mesh_handles.get((self.cluster_id, proc_mesh), ())):  # all see the new procs
            handle._procs[:] = reply["proc_mesh"]["procs"]
        if reply["failures"]:  # the first actor mesh's; the note names every broken one
            key, packed = sorted(reply["failures"].items())[0]
            record = reply["actor_meshes"][key]
            raise init_error(record["name"], f"{record['class_name'].rpartition('.')[2]}.__init__ (restarting)",
                             packed, Extent(record["extent"]), _restart_note(proc_mesh, reply))
        return reply

    def _info_of(self, timeout: float, proc_meshes=(), actor_meshes=()) -> dict:
        """The hub's ``info`` with only the meshes named (``hub_ops.INFO_OF``)."""
        return self.hub.request(hub_ops.INFO, timeout=timeout, **{
            hub_ops.INFO_OF: {"proc_meshes": list(proc_meshes), "actor_meshes": list(actor_meshes)}})

    def proc_mesh_record(self, name: str) -> dict | None:
        return self._info_of(30.0, proc_meshes=[name])["proc_meshes"].get(name)

    def actor_mesh_record(self, proc_mesh: str, name: str) -> dict | None:
        key = f"{proc_mesh}/{name}"
        return self._info_of(30.0, actor_meshes=[key])["actor_meshes"].get(key)

    def interrupt(self, procs: list[dict], timeout: float) -> None:
        # Straight to the procs, all at once: the hub is not on this path.
        with Gather(runtime().mailbox) as gather:
            for rank, proc in enumerate(procs):
                gather.request(proc["address"], self.cluster_id, {envelope.OP: proc_ops.INTERRUPT}, key=rank)
            gather.wait(len(procs), timeout)

    def interrupt_calls(self, meshes: list[tuple[str, str, dict[int, list[tuple[str, int]]]]],
                        timeout: float) -> list[int]:
        info = self._info_of(timeout, actor_meshes=[f"{proc_mesh}/{name}" for proc_mesh, name, _ in meshes])
        # Per mesh: proc control address -> routes of its calls sent directly, and router ->
        # the same for those sent through routers; each request's reply is kept under
        # (the mesh's index, the address it went to).
        asked: list[tuple[dict[str, list], dict[str, dict[str, list]]]] = []
        requests: list[tuple[tuple[int, str], dict]] = []
        for i, (proc_mesh, name, routes) in enumerate(meshes):
            direct, by_router = _interrupt_targets(info, proc_mesh, name, routes)
            asked.append((direct, by_router))
            requests += [((i, address), {envelope.OP: proc_ops.INTERRUPT, proc_ops.MESH: name,
                                         proc_ops.ROUTES: calls})
                         for address, calls in direct.items()]
            requests += [((i, router), {envelope.OP: router_ops.INTERRUPT, proc_ops.MESH: name,
                                        router_ops.TIMEOUT: timeout * ROUTER_WAIT_SHARE,
                                        router_ops.PROCS: [[address, calls] for address, calls in by_proc.items()]})
                         for router, by_proc in by_router.items()]  # one message per host: its router passes it on
        with Gather(runtime().mailbox) as gather:
            _request_all(gather, self.cluster_id, requests)
            gather.wait(len(requests), timeout)
            replies = dict(gather.replies)
        # Unconfirmed: a proc that did not answer, every proc of a router that did not, and
        # those a router names as not answering it (router_ops.MISSED).
        unconfirmed = []
        for i, (direct, by_router) in enumerate(asked):
            missed = sum(1 for address in direct if (i, address) not in replies)
            for router, by_proc in by_router.items():
                reply = replies.get((i, router))
                missed += len(by_proc) if reply is None else len(reply.header.get(router_ops.MISSED) or ())
            unconfirmed.append(missed)
        return unconfirmed

    def paused(self, timeout: float) -> list[dict]:
        return self.hub.request(hub_ops.DEBUG_PAUSED, timeout=timeout)["stops"]

    def set_rank_env(self, proc_mesh: str, env: dict[int, dict]) -> None:
        self.hub.request(hub_ops.SET_RANK_ENV, timeout=30.0, name=proc_mesh, env=env)

    def machines(self, host_ids: set[str]) -> int:
        hosts = self._info_of(30.0)["hosts"]
        return len({h.get("hostname") for h in hosts if h["host_id"] in host_ids})


def _interrupt_targets(info: dict, proc_mesh: str, name: str, routes: dict[int, list]
                       ) -> tuple[dict[str, list], dict[str, dict[str, list]]]:
    """Where to send the interrupt of actor mesh ``proc_mesh/name``'s calls ``routes``
    (base rank -> the routes of its calls), from the hub's ``info``: (proc control
    address -> routes of the calls sent to it directly, router -> proc control address
    -> routes of those sent through that router). Both empty when the mesh was stopped
    meanwhile: nothing runs there any more."""
    record, procs = info["actor_meshes"].get(f"{proc_mesh}/{name}"), info["proc_meshes"].get(proc_mesh)
    direct: dict[str, list] = {}
    by_router: dict[str, dict[str, list]] = {}
    if record is None or procs is None:
        return direct, by_router
    for rank, calls in routes.items():
        address = procs["procs"][record["proc_ranks"][rank]]["address"]
        for route in calls:
            if isinstance(route[1], (tuple, list)):  # (router, the route it gave the call): host.router
                by_router.setdefault(route[0], {}).setdefault(address, []).append(route)
            else:
                direct.setdefault(address, []).append(route)
    return direct, by_router


def _request_all(gather: Gather, cluster_id: str, requests: list[tuple[tuple[int, str], dict]]) -> None:
    """Send each ``((i, address), header)`` of ``requests`` to ``address``, its reply kept
    under ``(i, address)``. (A loop of its own, called from the ``with`` block: see
    ``monarch_nb.wire.interrupts``.)"""
    for (i, address), header in requests:
        gather.request(address, cluster_id, header, key=(i, address))


def _restart_note(proc_mesh: str, reply: dict) -> str:
    """What a restart in which some ``__init__`` raised again did: which procs are back
    with which actor meshes, and what to do with each mesh left failed on them."""
    restarted = sorted(reply["restarted"])
    which = f"rank {restarted[0]}" if len(restarted) == 1 else f"ranks {', '.join(map(str, restarted))}"
    broken = reply["failures"]
    back = sorted(r["name"] for key, r in reply["actor_meshes"].items()
                  if key not in broken and set(restarted) & set(r["proc_ranks"]))
    lines = [f"restarted proc {which} of {proc_mesh!r}; back: {', '.join(back) or 'no other actor mesh'}"]
    for key in sorted(broken):
        name, ranks = reply["actor_meshes"][key]["name"], sorted(int(r) for r in broken[key])
        lines.append(f"{name} stays failed there: stop it ({name}.stop()) and spawn it again, or restart it "
                     f"({name}.restart({ranks})) once its __init__ can succeed")
    return "\n".join(lines)
