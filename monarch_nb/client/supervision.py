"""Supervision in the client: calls to dead actors fail promptly, and failures nobody
handled reach the user.

The host agent sees its child exit at once and tells the hub, which tells every
client which actor addresses died (or were stopped) and why (``actors_gone``). Here, every call still waiting on one of
those actors gets a failure reply for that rank (sent to this process's own mailbox,
so it is dispatched like any reply), and later calls to them fail without being sent.
The call then raises :class:`SupervisionError` naming mesh, rank, host, pid and cause.

A failure that no owning actor handled (see ``hub.supervision``), on a mesh whose
failures no owner in this client handles (:meth:`Supervision.mark_handled`: a service
replaces its failed replicas), is passed to the
failure hook (``ClientRuntime.set_failure_hook``). The default hook arms it: the next call on the affected mesh (the mesh
whose ``broadcast`` endpoint raised in an actor that survives it, or the owner's mesh
for a failure in a mesh an actor spawned that the owner survives) raises it as :class:`SupervisionError` once, without being sent. The
notebook extension's hook also shows it at once. Then Monarch's hook
(``monarch_nb.actor.unhandled_fault_hook(failure)``, looked up at each failure so that
assigning the module attribute replaces it) is called; what it raises is printed, never
raised in the event thread. Actor and proc deaths fail the calls that involve the dead
ranks anyway; other slices of the mesh keep working.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import Callable

from ..errors import MeshFailure, SupervisionError
from ..proc.actor import proc_identity
from ..protocol import envelope, events, proc_ops, router_ops
from ..protocol.states import FailureKind
from ..wire import frames as wire_frames
from ..wire import sockets
from ..wire.mailbox import Mailbox
from ..wire.remote_error import pack_exception

FailureHook = Callable[[str, MeshFailure, "dict | None"], None]

# What a client remembers of dead actors, per kind (a retained cluster's client may live
# for days of spawns and deaths): past this many the oldest are forgotten. A call through
# a handle to an actor forgotten here is sent, and fails at its timeout instead of at once.
REMEMBERED_DEATHS = 100_000


class _Recent(OrderedDict):
    """A dict that keeps only its ``REMEMBERED_DEATHS`` most recently set keys."""

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        if len(self) > REMEMBERED_DEATHS:
            self.popitem(last=False)


class Supervision:
    """What this client knows of dead actors and unhandled failures (one per process,
    owned by the client runtime). ``mailbox()`` gives the process's mailbox, to which
    failure replies are sent."""

    def __init__(self, mailbox: Callable[[], Mailbox]):
        self._mailbox = mailbox
        # No loop runs directly in a `with self._lock:` block: each is in a method of its
        # own (_watch, _unwatch, ...) called under the lock. On Python 3.12+ a loop's
        # back-edge there can fall outside the block's exception handler, and a Ctrl-C
        # raised at it by a SIGINT handler of the user's own left the lock held for good
        # (see monarch_nb.wire.interrupts).
        self._lock = threading.Lock()
        # actor address -> (cluster id, why it is gone). The cluster matters: a port a dead
        # actor of a stopped cluster had is often a new cluster's actor's port.
        self._dead: dict[str, tuple[str, str]] = _Recent()
        # port -> (cluster id, its targets: actor address -> base rank, the addresses among
        # them whose death has failed it already), of the calls waiting on actors. Kept per
        # call, not per actor: a call over a mesh costs two dict operations here, not two
        # per actor; a death (rare) looks through the calls in flight instead.
        self._watching: dict[int, tuple[str, dict[str, int], set[str]]] = {}
        self._armed: dict[tuple[str, str], list[MeshFailure]] = {}  # (cluster id, actor mesh) -> failures
        self._names: dict[str, tuple[str, str, int]] = _Recent()  # dead actor's address -> (cluster id, mesh, rank)
        # (cluster id, mesh, rank) of dead actors whose death failed a call of this client
        self._told: dict[tuple[str, str, int], None] = _Recent()
        self._stopped: dict[str, str] = {}  # cluster id -> why: clusters this client stopped
        self._lost_hubs: set[str] = set()  # of those, the ones whose hub died (it may come back)
        self._hook: FailureHook = self.say_and_arm
        self._heard: dict[tuple[str, str], None] = _Recent()  # (cluster id, actor mesh) with a failure heard
        # (cluster id, actor or proc mesh) -> who handles its failures (e.g. "service 'policy'")
        self._handled: dict[tuple[str, str], str] = {}
        self._heard_changed = threading.Condition()
        # Relays (host routers this client's routed calls go through: router_ops.RELAY):
        # port -> (cluster id, router address), of the calls waiting on one; and
        # (cluster id, router address) -> why, of those lost with their host.
        self._relayed: dict[int, tuple[str, str]] = {}
        self._lost_routers: dict[tuple[str, str], str] = _Recent()
        # Counts actors_gone reports: a sender that saw it change while it sent checks its
        # targets again (a socket closed for a dead actor may have been made again by it).
        self.deaths = 0
        # Gives Monarch's unhandled_fault_hook as it is now (set by monarch_nb.actor).
        self.fault_hook: Callable[[], Callable[[MeshFailure], object]] | None = None

    # calls waiting on actors ------------------------------------------------------------
    def _is_dead(self, cluster_id: str, address: str, mesh: str | None, rank: int | None) -> str | None:
        """Why the actor at ``address`` (rank ``rank`` of actor mesh ``mesh``, where known)
        is gone, or ``None``. A death is of one actor: a new actor of another mesh or rank
        at that address (the OS reused the port) is alive. The caller holds the lock."""
        entry = self._dead.get(address)
        if entry is None or entry[0] != cluster_id:
            return None
        name = self._names.get(address)
        if mesh is not None and name is not None and (name[1], name[2]) != (mesh, rank):
            return None
        return entry[1]

    def watch(self, cluster_id: str, port: int, targets: dict[str, int], mesh: str | None = None) -> dict[str, str]:
        """Note that ``port`` waits on the actors at ``targets`` (address -> base rank) of
        actor mesh ``mesh`` (kept, not copied: the caller must not change it); returns
        those already known dead (address -> why), which must not be called."""
        with self._lock:
            return self._watch(cluster_id, port, targets, mesh)

    def _watch(self, cluster_id: str, port: int, targets: dict[str, int], mesh: str | None) -> dict[str, str]:
        self._watching[port] = (cluster_id, targets, set())
        return self._dead_among(cluster_id, targets, mesh, targets.__getitem__)

    def heard_dead(self, cluster_id: str, address: str, mesh: str, rank: int, why: str) -> None:
        """A call's reply said the actor at ``address`` (rank ``rank`` of ``mesh``) died:
        known gone from now on, before the hub's ``actors_gone`` for it arrives (which
        fails the other calls waiting on it)."""
        with self._lock:
            if self._dead.get(address, (None,))[0] != cluster_id:
                self._dead[address] = (cluster_id, why)
                self._names[address] = (cluster_id, mesh, rank)

    def dead_among(self, cluster_id: str, addresses: list[str], mesh: str,
                   base_rank: Callable[[str], int]) -> dict[str, str]:
        """Of the actors at ``addresses`` of actor mesh ``mesh`` (``base_rank(address)``: the
        rank of one), those known dead (address -> why): what a call to them fails with,
        as :meth:`watch` returns, for a send that waits on nothing (``broadcast``)."""
        if not self.knows_deaths():
            return {}
        with self._lock:
            return self._dead_among(cluster_id, addresses, mesh, base_rank)

    def knows_deaths(self) -> bool:
        """Whether any actor (or a cluster this client stopped) is known gone: if not,
        :meth:`dead_among` finds none (a test without the lock, for the hot path)."""
        return bool(self._dead) or bool(self._stopped)

    def _dead_among(self, cluster_id: str, addresses, mesh: str | None,
                    base_rank: Callable[[str], int]) -> dict[str, str]:
        """:meth:`dead_among` (``addresses``: any iterable of them); they count as told to
        this client. The caller holds the lock."""
        stopped = self._stopped.get(cluster_id)
        if stopped is not None:
            return dict.fromkeys(addresses, stopped)
        if not self._dead:  # no death known at all: the usual case
            return {}
        # Only targets with a death recorded at their address can be dead: found by a set
        # intersection (in C), so a send to many live actors costs no Python loop.
        known = self._dead.keys() & addresses
        dead = {a: why for a in known if (why := self._is_dead(cluster_id, a, mesh, base_rank(a))) is not None}
        for a in dead:
            if a in self._names:
                self._told[self._names[a]] = None
        return dead

    def unwatch(self, port: int) -> None:
        """``port`` waits on no actor any more (its call settled)."""
        with self._lock:
            self._relayed.pop(port, None)
            self._watching.pop(port, None)

    # relays -------------------------------------------------------------------------------
    def router_lost(self, cluster_id: str, router: str) -> str | None:
        """Why the host router at ``router`` of ``cluster_id`` is known lost (its host
        was), or ``None``."""
        return self._lost_routers.get((cluster_id, router))

    def watch_relay(self, cluster_id: str, port: int, router: str) -> None:
        """Note that the call at ``port`` waits on replies relayed through ``router``: if
        its host is lost, the call fails (``router_ops.RELAY_LOST``), at once if it is
        already. :meth:`unwatch` of the port ends it."""
        with self._lock:
            self._relayed[port] = (cluster_id, router)
            why = self._lost_routers.get((cluster_id, router))
        if why is not None:
            self._fail_relayed(cluster_id, port, router, why)

    def _routers_gone(self, cluster_id: str, routers: dict) -> None:
        """The hub's news that the hosts of ``routers`` (address -> why) were lost: the
        calls relayed through one of them fail, ranks still out and all."""
        with self._lock:
            failing = self._note_routers_gone(cluster_id, routers)
        for port, router, why in failing:
            self._fail_relayed(cluster_id, port, router, why)

    def _note_routers_gone(self, cluster_id: str, routers: dict) -> list[tuple[int, str, str]]:
        """Record ``routers`` lost; the calls relayed through them, as (port, router, why).
        The caller holds the lock (a loop of its own: see ``__init__``)."""
        for router, why in routers.items():
            self._lost_routers[(cluster_id, router)] = why
        failing = [(port, router, routers[router]) for port, (cid, router) in self._relayed.items()
                   if cid == cluster_id and router in routers]
        for port, _, _ in failing:
            del self._relayed[port]
        return failing

    def _fail_relayed(self, cluster_id: str, port: int, router: str, why: str) -> None:
        mailbox = self._mailbox()
        header = {envelope.PORT: port, envelope.OK: False, proc_ops.DIED: True, router_ops.RELAY_LOST: True}
        error = SupervisionError(f"the host router {router} this call was relayed through was lost with its host "
                                 f"({why}); the ranks still out may or may not have run it")
        mailbox.send(mailbox.address, wire_frames.encode_value(cluster_id, header, pack_exception(error)))

    def sync(self, cluster_id: str, addresses: list[str], dead: dict, mesh: str) -> None:
        """The hub's view of actor mesh ``mesh`` of ``cluster_id``: the actors at
        ``addresses`` are alive except those whose rank is in ``dead`` (rank -> why it is
        gone: the report calls raise)."""
        with self._lock:
            for rank, address in enumerate(addresses):
                why = dead.get(str(rank), dead.get(rank))
                if why is None:
                    self._dead.pop(address, None)  # a live actor; its port may be a dead one's, reused
                else:
                    self._dead[address] = (cluster_id, why)
                    self._names[address] = (cluster_id, mesh, rank)

    def fail(self, cluster_id: str, port: int, base_rank: int, why: str, alone: bool = False) -> None:
        """Send the waiting call at ``port`` a failure reply for ``base_rank`` (``alone``:
        the actor died, its proc lives on)."""
        mailbox = self._mailbox()
        header = {envelope.PORT: port, envelope.RANK: base_rank, envelope.OK: False, proc_ops.DIED: True,
                  proc_ops.ALONE: alone}
        mailbox.send(mailbox.address, wire_frames.encode_value(cluster_id, header,
                                                                 pack_exception(SupervisionError(why))))

    def end_grace_later(self, cluster_id: str, port: int, seconds: float) -> threading.Timer:
        """In ``seconds``, tell the call waiting at ``port`` (one of whose ranks died) to
        wait no longer on its ranks still out (``GRACE_OVER``, sent to this process's own
        mailbox, so it is dispatched like a reply, never concurrently with one). Returns
        the timer: cancel it when the call ends first."""
        def end() -> None:
            mailbox = self._mailbox()
            try:
                mailbox.send(mailbox.address, wire_frames.encode(cluster_id, {envelope.PORT: port,
                                                                              proc_ops.GRACE_OVER: True}))
            finally:
                mailbox.outbox.close_thread_sockets()  # this thread ends here

        timer = threading.Timer(seconds, end)
        timer.daemon = True
        timer.start()
        return timer

    def why_dead(self, cluster_id: str, address: str, mesh: str | None = None, rank: int | None = None) -> str | None:
        """Why the actor of ``cluster_id`` at ``address`` (rank ``rank`` of actor mesh
        ``mesh``, where known) is known gone, or ``None``. Every actor of a cluster
        stopped (or whose hub is lost) is, as :meth:`watch` says: a call that failed on
        one of them names the others with it."""
        with self._lock:
            stopped = self._stopped.get(cluster_id)
            return stopped if stopped is not None else self._is_dead(cluster_id, address, mesh, rank)

    # hub events -------------------------------------------------------------------------
    def on_event(self, event: dict) -> None:
        """An event bus subscriber: ``actors_gone``, ``actors_back`` and ``supervision`` events."""
        op = event.get(envelope.OP)
        if op == events.ACTORS_GONE:
            self.actors_gone(event)
        elif op == events.ACTORS_BACK:
            self.actors_back(event)
        elif op == events.SUPERVISION:
            failure = MeshFailure.from_event(event["failure"])
            # An actor that joined the hub to call other meshes hears these too, but an
            # unhandled failure is the client's to report (a mesh an actor owns reaches
            # its __supervise__, not this): it printed other meshes' failures as its own.
            if self.handled_by(event[events.CLUSTER], failure) is None and proc_identity() is None:
                self._hook(event[events.CLUSTER], failure, event["failure"].get("owner"))
                self._call_fault_hook(failure)
            with self._heard_changed:
                for mesh in failure.meshes:
                    self._heard[(event[events.CLUSTER], mesh)] = None
                self._heard_changed.notify_all()

    def mark_handled(self, cluster_id: str, meshes: list[str], owner: str | None) -> None:
        """Failures of the actor or proc meshes ``meshes`` of ``cluster_id`` are handled
        by ``owner`` (a name for people, e.g. ``"service 'policy'"``): they still fail the
        calls that involve them, but no failure hook hears of them (nothing is printed
        nor armed, Monarch's ``unhandled_fault_hook`` is not called). ``owner=None``
        ends that (the owner is gone). A mesh may be marked before it exists (by the
        name it will be spawned with), so that failures while it starts are handled."""
        with self._lock:
            for mesh in meshes:
                if owner is None:
                    self._handled.pop((cluster_id, mesh), None)
                else:
                    self._handled[(cluster_id, mesh)] = owner

    def handled_by(self, cluster_id: str, failure: MeshFailure) -> str | None:
        """Who handles ``failure`` (see :meth:`mark_handled`): the owner of every mesh it
        hit (its actor meshes, else its proc mesh), or ``None`` when one is not handled."""
        hit = list(failure.meshes) or ([failure.proc_mesh] if failure.proc_mesh else [])
        with self._lock:
            owners = self._owners(cluster_id, hit)
        return None if not owners or None in owners else owners.pop()

    def _owners(self, cluster_id: str, meshes: list[str]) -> set[str | None]:
        return {self._handled.get((cluster_id, mesh)) for mesh in meshes}

    def wait_heard(self, cluster_id: str, mesh: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until a failure of actor mesh ``mesh`` has gone
        through the failure hooks (``spawn`` waits so for its ``__init__`` failures: a
        script says them before its next line, a notebook under the spawning cell).
        Returns whether one has."""
        with self._heard_changed:
            return self._heard_changed.wait_for(lambda: (cluster_id, mesh) in self._heard, timeout)

    def actors_gone(self, event: dict) -> None:
        """The hub's news that actors died with their proc or were stopped: fail what waits
        on them, and close the sockets to them (dropping calls still queued for them)."""
        cluster = event.get(events.CLUSTER, "")
        with self._lock:
            self.deaths += 1
            pending = self._note_gone(cluster, event["actors"])
        for address in event["actors"]:  # no socket of any thread keeps reconnecting to them
            sockets.Outbox.discard(address)
        alone = bool(event.get(proc_ops.ALONE))  # an actor's death, not its proc's
        for port, cluster_id, base_rank, reason in pending:
            self.fail(cluster_id, port, base_rank, reason, alone)
        routers = event.get(events.ROUTERS_GONE)
        if routers:
            self._routers_gone(cluster, routers)

    def actors_back(self, event: dict) -> None:
        """The hub's news that actors reported gone with a lost host live again (its agent
        was heard from again, ``hub.supervision``): calls through handles made before
        reach them again, as through handles made since."""
        with self._lock:
            self._forget_dead(event.get(events.CLUSTER, ""), event["actors"])

    def _forget_dead(self, cluster: str, addresses) -> None:
        """Forget the deaths recorded for ``addresses`` of ``cluster``. The caller holds the
        lock (a loop of its own, called from the ``with`` block: see
        ``monarch_nb.wire.interrupts``)."""
        for address in addresses:
            known = self._dead.get(address)
            if known is not None and known[0] == cluster:
                del self._dead[address]

    def _note_gone(self, cluster: str, actors: dict) -> list[tuple[int, str, int, str]]:
        """Record ``actors`` (address -> (mesh, rank, why)) of ``cluster`` as dead; the
        calls of this cluster that waited on them, as (port, cluster id, base rank, why).
        The caller holds the lock."""
        for address, (mesh, rank, why) in actors.items():
            self._dead[address] = (cluster, why)
            self._names[address] = (cluster, mesh, rank)
        pending = []
        for port, (cid, targets, failed) in self._watching.items():
            if cid != cluster:  # not another cluster's calls
                continue
            hit = (actors.keys() & targets.keys()) - failed  # (in C: no loop over the call's actors)
            failed |= hit
            pending += [(port, cid, targets[address], actors[address][2]) for address in hit]
            self._told.update(dict.fromkeys(self._names[address] for address in hit))
        return pending

    def hub_lost(self, cluster_id: str, why: str) -> None:
        """The cluster's hub is dead, and its procs with it: as :meth:`cluster_stopped`,
        until :meth:`hub_back`."""
        self._fail_cluster(cluster_id, why, hub_lost=True)

    def hub_back(self, cluster_id: str) -> None:
        """A hub runs again for the cluster (recovered): calls on it are sent again."""
        with self._lock:
            if cluster_id in self._lost_hubs:
                self._lost_hubs.discard(cluster_id)
                self._stopped.pop(cluster_id, None)

    def cluster_stopped(self, cluster_id: str, why: str) -> None:
        """This client stopped the cluster: its hub will send no news of the actors, so
        every call still waiting on them fails now with ``why``, and later calls at once."""
        self._fail_cluster(cluster_id, why, hub_lost=False)

    def stopped_why(self, cluster_id: str) -> str | None:
        """Why the cluster is stopped for good (by this client: :meth:`cluster_stopped`),
        or ``None``."""
        with self._lock:
            return None if cluster_id in self._lost_hubs else self._stopped.get(cluster_id)

    def _fail_cluster(self, cluster_id: str, why: str, hub_lost: bool) -> None:
        with self._lock:
            self._stopped[cluster_id] = why
            if hub_lost:
                self._lost_hubs.add(cluster_id)
            else:  # stopped for good: no hub coming back lifts it
                self._lost_hubs.discard(cluster_id)
            pending = self._take_waiting(cluster_id)
        for port, base_rank in pending:
            self.fail(cluster_id, port, base_rank, why)

    # unhandled failures -----------------------------------------------------------------
    def reached_a_call(self, cluster_id: str, failure: MeshFailure) -> bool:
        """Whether ``failure`` (a death) already failed a call of this client: that call's
        ``get()`` raises it, so whoever waits on the call has it to handle."""
        with self._lock:
            return any((cluster_id, mesh, rank) in self._told for mesh in failure.meshes for rank in failure.ranks)

    def arm(self, cluster_id: str, failure: MeshFailure, owner: dict | None = None) -> None:
        """The next call on the affected mesh raises ``failure``."""
        meshes = [owner["mesh"]] if owner else (failure.meshes if failure.kind == FailureKind.ENDPOINT_FAILED else ())
        with self._lock:
            for mesh in meshes:
                self._armed.setdefault((cluster_id, mesh), []).append(failure)

    def say_and_arm(self, cluster_id: str, failure: MeshFailure, owner: dict | None = None) -> None:
        """The default failure hook (a script's; the notebook's shows failures under the
        cell): says ``failure`` at once on stderr, then :meth:`arm`."""
        print(f"monarch_nb: unhandled failure: {failure.report()}", file=sys.stderr, flush=True)
        self.arm(cluster_id, failure, owner)

    def set_failure_hook(self, hook: FailureHook | None) -> None:
        """Route unhandled failures to ``hook(cluster_id, failure, owner)`` instead of the
        default (:meth:`say_and_arm`); ``None`` restores the default."""
        if hook is not None and not callable(hook):
            raise TypeError(f"set_failure_hook needs a function (cluster_id, failure, owner) or None, not {hook!r}")
        self._hook = hook or self.say_and_arm

    def _call_fault_hook(self, failure: MeshFailure) -> None:
        hook = self.fault_hook() if self.fault_hook is not None else None
        if hook is None:
            return
        try:
            hook(failure)
        except BaseException as e:  # noqa: BLE001 - e.g. Monarch's sys.exit(1): never end the event thread
            print(f"monarch_nb: unhandled_fault_hook raised {type(e).__name__}: {e} for: {failure}",
                  file=sys.stderr)

    def raise_armed(self, cluster_id: str, mesh: str) -> None:
        """Raise (once) the failures armed for ``mesh``: called before a call is sent.
        A call on a cluster this client stopped raises ``SupervisionError`` every time."""
        if not self._armed and not self._stopped:  # the hot path: nothing armed anywhere
            return
        stopped = self._stopped.get(cluster_id)
        if stopped is not None:
            raise SupervisionError(stopped)
        with self._lock:
            failures = self._armed.pop((cluster_id, mesh), None)
        if failures:
            failures.sort(key=lambda f: f.ranks)
            error = SupervisionError(f"{mesh}: unhandled failure since the last call: "
                                     + "; ".join(f.why for f in failures))
            error.events = failures
            raise error

    def clear_pending(self, cluster_id: str, mesh: str) -> None:
        """Forget armed failures of ``mesh`` (it was restarted)."""
        with self._lock:
            self._armed.pop((cluster_id, mesh), None)

    def _take_waiting(self, cluster_id: str) -> list[tuple[int, int]]:
        """Forget every call of ``cluster_id`` waiting on an actor; them as (port, base
        rank). The caller holds the lock."""
        pending = []
        for port, (cid, targets, failed) in list(self._watching.items()):
            if cid == cluster_id:
                pending += [(port, base) for address, base in targets.items() if address not in failed]
                del self._watching[port]
        return pending
