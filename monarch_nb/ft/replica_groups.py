"""Replica groups: N copies of a training job, each its own proc mesh (and its own
torch.distributed group), of which a failed one is torn down and respawned while the
others keep stepping. The controller is the quorum: each step runs on the groups that
are healthy when it starts, and a recovered group rejoins at the next step, after a
hook has given it the state of a healthy one.

This is the shape of TorchFT's replica groups with Monarch as the controller (process
faults recovered while the healthy groups continue), without TorchFT's lighthouse and
fault-tolerant all-reduce across groups: what crosses groups here is what the
controller moves (the ``on_join`` hook; an average of the groups' weights if the program
does one).
"""

from __future__ import annotations

import enum
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..client.actor_mesh import ActorMesh
from ..client.host_mesh import HostMesh
from ..client.proc_mesh import ProcMesh
from ..client.value_mesh import ValueMesh
from ..client.runtime import runtime
from ..errors import ActorError, ClusterError, SupervisionError
from ..protocol import hub_ops
from .bounded import call_within
from .group_allocations import AllocationPlacement
from .placement import SPARE, HostPlacement, hosts_of
from .step_loops import StepLoops
from .torchft_quorum import TorchFTLighthouse, require_torchft
from .warm_spare import WarmSpare

QUORUMS = ("controller", "torchft")
# What a spare imports for a group with a backend: most of a fresh proc's start on a loaded
# host. torch._dynamo is what a torch.optim optimizer imports when the first one is made
# (~800 modules, 0.9 s on an idle core here).
SPARE_IMPORTS = ("torch", "torch.distributed", "torch._dynamo")
# What a failed step raises: a proc died, an endpoint raised, the step passed step_timeout.
STEP_FAILURES = (SupervisionError, ActorError, TimeoutError)
# A replacement that failed before it rejoined is respawned after this long, twice as long
# after each such failure in a row (at most RESPAWN_RETRY_MAX_S), as a service's replicas
# are (service.lifecycle): a passing cause (a flaky rendezvous, memory not yet freed) does
# not spend every restart max_restarts allows at once.
RESPAWN_RETRY_S = 0.5
RESPAWN_RETRY_MAX_S = 8.0


def why_step_failed(error: BaseException) -> str:
    """One line for ``status()``: the error's class and its message's first line."""
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


class GroupState(str, enum.Enum):
    HEALTHY = "healthy"  # steps run on it
    RECOVERING = "recovering"  # failed; being torn down and respawned
    JOINING = "joining"  # respawned; joins at the start of the next step (after on_join)
    FAILED = "failed"  # failed more than ``max_restarts`` times: left out for good
    STOPPED = "stopped"


@dataclass
class ReplicaGroup:
    """One replica group: its procs and actors (replaced on each recovery), its state, how
    many times it was restarted, why it last failed, and how long each recovery took
    (seconds, from the failure being seen to the group stepping again)."""

    index: int
    procs: ProcMesh
    actors: ActorMesh
    state: GroupState = GroupState.HEALTHY
    restarts: int = 0
    last_failure: str = ""
    recoveries_s: list[float] = field(default_factory=list)
    failed_at: float = 0.0  # time.monotonic() when its last failure was seen
    strikes: int = 0  # failures on the hosts it runs on now (reallocate_after)
    respawns_failed: int = 0  # replacements in a row that failed before rejoining (paces the next)
    # Where its last recovery's time went (s): teardown, procs, torch_distributed, actors, join.
    recovery_phases: dict[str, float] = field(default_factory=dict)

    @property
    def is_healthy(self) -> bool:
        return self.state is GroupState.HEALTHY

    def summary(self) -> dict:
        return {"group": self.index, "state": self.state.value, "restarts": self.restarts,
                "last_failure": self.last_failure, "recoveries_s": [round(s, 3) for s in self.recoveries_s],
                "recovery_phases_s": {k: round(s, 3) for k, s in self.recovery_phases.items()},
                "pids": self.procs.pids, "hosts": hosts_of(self.procs), "strikes": self.strikes}


class ReplicaGroups:
    """``num_groups`` replica groups of ``actor_class(*args, **kwargs)``, one actor per proc,
    each group a proc mesh of ``per_group`` (e.g. ``{"gpus": 2}``) on ``hosts``.

    ``backend`` (``"gloo"``, ``"nccl"``; ``None``: none) sets up torch.distributed in each
    group (``ProcMesh.setup_torch_distributed``) before its actors start, so that their
    ``__init__`` may ``init_process_group``. ``on_join(group, donor)`` runs when a
    recovered group rejoins, at the start of a step (between the donor's steps), ``donor``
    a healthy group (``None`` when none is left): load the donor's weights into
    ``group.actors`` there (e.g. read through an ``RDMABuffer`` the donor's actors
    return). ``max_restarts``: a group
    that fails more often is left out (``GroupState.FAILED``); a replacement that fails
    before it rejoins (its procs or constructors failed, or ``on_join`` raised: its procs
    died, or the hook failed) counts as a restart and is respawned again, after
    ``RESPAWN_RETRY_S`` (doubling with each such failure in a row). ``step_timeout`` (seconds,
    ``None``: no limit): a group whose step takes longer is taken as hung and recovered;
    an ``on_join`` that takes longer is a replacement that failed (its hook is left
    running on a thread of its own).

    ``quorum="torchft"`` (torchft installed) starts TorchFT's lighthouse as an actor
    (``self.lighthouse``, on a proc of its own, needing ``min_replicas`` groups for a
    quorum) and gives every proc of group i ``TORCHFT_LIGHTHOUSE``, ``REPLICA_GROUP_ID=i``
    and ``NUM_REPLICA_GROUPS`` before its actors start, so that a ``torchft.Manager``
    made in ``__init__`` joins it (``ft.torchft_quorum``); give ``backend`` too, for the
    Manager's ``MASTER_ADDR``/``MASTER_PORT``. The default, ``"controller"``: each step
    runs on the groups healthy when it starts.

    ``spare=True`` keeps one group's procs started in advance (``SPARE_IMPORTS``,
    torch's, imported there when ``backend`` is given): a failed group is
    replaced on them, which saves a fresh interpreter's imports, and a new spare starts
    once the group steps again. It costs ``per_group`` idle procs.

    ``hosts_per_group=k`` gives each group, and the spare, ``k`` hosts of ``hosts`` (a
    mesh over ``{"hosts": N}``) no other group uses, so that a lost machine (a host
    agent lost: ``inject_fault(..., "host")``) costs one group only: it is started again
    on its own hosts while they are live, else on free live ones (give ``hosts`` more
    than ``num_groups * k``). A step on a lost host fails when the hub counts the host
    lost: at once when its agent's exit is seen, else 3 s after it fell silent.
    ``None`` (the default): every group spans all of ``hosts``.

    ``reallocate_after=K`` (with ``hosts_per_group`` or ``allocator``): a group that
    failed K times on the hosts it runs on (a flaky node, say) moves on its next
    recovery, as after a lost host: to free hosts, or to a new allocation with its old
    one given back (TorchFT's Monarch example gets a new job every few attempts).
    ``status()[i]["strikes"]`` counts those failures.

    ``allocator`` (e.g. ``SlurmAllocator(nodes=2)``) instead gives each group, and the
    spare, an allocation of its own from ``hosts``'s cluster (``Cluster.allocate``: a
    Slurm job per group, as TorchFT's Monarch example runs them): a group that fails
    with its hosts live starts again on them; one whose allocation lost a host (a
    node failed, the job was cancelled or preempted) gives it back and gets a new one,
    the other groups' jobs untouched. ``hosts`` is then where the lighthouse runs. A
    group failed for good, and :meth:`stop`, give their allocations back.

    Blocks until every group's actors are constructed. Raises ``ValueError`` for
    ``num_groups < 1``, ``max_restarts < 0``, an unknown ``quorum``, fewer than
    ``num_groups * hosts_per_group`` hosts, both ``hosts_per_group`` and
    ``allocator``, a ``reallocate_after`` below 1 or without either, or proc meshes of
    ``name``'s groups still running (groups of that name not stopped: a re-run cell);
    ``TypeError`` for an ``allocator`` that is not one; ``ImportError`` for
    ``quorum="torchft"`` without torchft; :class:`ClusterError` when a group's
    allocation does not come up."""

    def __init__(self, hosts: HostMesh, name: str, actor_class: type, *args: Any, num_groups: int,
                 per_group: dict[str, int], backend: str | None = None, max_restarts: int = 3,
                 on_join: Callable[[ReplicaGroup, ReplicaGroup | None], None] | None = None,
                 step_timeout: float | None = None, quorum: str = "controller", min_replicas: int = 1,
                 spare: bool = False, hosts_per_group: int | None = None, allocator=None,
                 reallocate_after: int | None = None, **kwargs: Any):
        if num_groups < 1:
            raise ValueError(f"ReplicaGroups: num_groups={num_groups}; give at least 1")
        if max_restarts < 0:
            raise ValueError(f"ReplicaGroups: max_restarts={max_restarts}; give 0 (never restart) or more")
        if quorum not in QUORUMS:
            raise ValueError(f"ReplicaGroups: quorum={quorum!r}; give {' or '.join(map(repr, QUORUMS))}")
        if reallocate_after is not None and (hosts_per_group is None and allocator is None
                                             or not isinstance(reallocate_after, int) or reallocate_after < 1):
            raise ValueError(f"ReplicaGroups: reallocate_after={reallocate_after!r}: give a number of failures >= 1, "
                             "with hosts_per_group or allocator (the groups need hosts of their own to move)")
        if quorum == "torchft":
            require_torchft()  # before anything is asked of the cluster
        ours = re.compile(rf"{re.escape(name)}_(\d+|spare_\d+|lighthouse)")  # the names its meshes get
        running = [m for m in hosts._hub().request(hub_ops.INFO, timeout=30.0)["proc_meshes"] if ours.fullmatch(m)]
        if running:
            raise ValueError(f"ReplicaGroups {name!r}: proc meshes of that name run already ({', '.join(running)}); "
                             "stop the groups made before (groups.stop()) or give another name")
        if hosts_per_group is not None and allocator is not None:
            raise ValueError("ReplicaGroups: give hosts_per_group (groups on hosts of the host mesh) or allocator "
                             "(each group on an allocation of its own), not both")
        self._placement: HostPlacement | AllocationPlacement | None = None
        if hosts_per_group is not None:
            self._placement = HostPlacement(hosts, hosts_per_group, num_groups * hosts_per_group)
        elif allocator is not None:
            self._placement = AllocationPlacement(hosts, name, allocator)
        self._hosts, self._name, self._class = hosts, name, actor_class
        self._args, self._kwargs = args, kwargs
        self._per_group, self._backend = dict(per_group), backend
        self._max_restarts, self._on_join, self._step_timeout = max_restarts, on_join, step_timeout
        self._reallocate_after = reallocate_after
        self._lock = threading.Lock()
        self._recoveries: list[threading.Thread] = []
        self._spawned = 0  # proc meshes made so far: each gets a fresh name
        self._stopping = False  # stop() called: no group is respawned or admitted any more
        self._stopped = threading.Event()  # set with _stopping: ends a pause before a respawn
        self._loops: StepLoops | None = None  # run()'s, once called
        self._num_groups = num_groups
        # Failures of the groups' meshes are this object's to recover, not to print under
        # the cell as unhandled (as a service's replicas): the actor mesh name all groups
        # share, and each proc mesh's name as it is made (ends with stop()).
        self._handled: list[str] = []
        self._mark_handled(name)
        self.lighthouse: TorchFTLighthouse | None = None
        self.groups: list[ReplicaGroup] = []
        self.spare: WarmSpare | None = None
        try:
            if quorum == "torchft":
                self.lighthouse = TorchFTLighthouse(hosts, name, min_replicas=min_replicas)
            for i in range(num_groups):
                self.groups.append(self._start_group(i))
        except BaseException:
            for group in self.groups:
                group.procs.stop()
            if self.lighthouse is not None:
                self.lighthouse.stop()
            if self._placement is not None:
                self._placement.stop()
            runtime().supervision.mark_handled(hosts._cluster_id, self._handled, None)  # no owner after all
            raise
        if spare:
            spare_hosts = hosts if self._placement is None else self._spare_hosts
            self.spare = WarmSpare(spare_hosts, name, per_group, SPARE_IMPORTS if backend else (),
                                   named=self._mark_handled)
        if self.spare is not None:
            self.spare.refill()

    def _start_group(self, index: int) -> ReplicaGroup:
        procs, actors = self._spawn(index)
        return ReplicaGroup(index, procs, actors)

    def _spawn(self, index: int, phases: dict[str, float] | None = None,
               spare: ProcMesh | None = None) -> tuple[ProcMesh, ActorMesh]:
        """Group ``index``'s procs (``spare``'s, when given) and actors, fresh; each
        step's seconds into ``phases``."""
        phases = {} if phases is None else phases
        started = time.monotonic()
        procs = self._new_procs(index) if spare is None else spare
        try:
            if spare is not None and self.lighthouse is not None:
                self.lighthouse.export_to(procs, index, self._num_groups)
            phases["procs"], started = time.monotonic() - started, time.monotonic()
            if self._backend is not None:
                procs.setup_torch_distributed(self._backend)
                phases["torch_distributed"], started = time.monotonic() - started, time.monotonic()
            actors: ActorMesh = procs.spawn(self._name, self._class, *self._args, raise_init_errors=True, **self._kwargs)
            phases["actors"] = time.monotonic() - started
        except BaseException:
            procs.stop()
            raise
        return procs, actors

    def _new_procs(self, index: int) -> ProcMesh:
        with self._lock:
            self._spawned += 1
            mesh_name = f"{self._name}_{self._spawned}"
        self._mark_handled(mesh_name)
        bootstrap = None if self.lighthouse is None else self.lighthouse.bootstrap(index, self._num_groups)
        hosts = self._hosts
        if self._placement is not None:
            group = next((g for g in self.groups if g.index == index), None)
            old = [] if group is None else hosts_of(group.procs)
            taken = self._hosts_taken(but=index)
            if group is not None and self._reallocate_after is not None and group.strikes >= self._reallocate_after:
                # Failed that often where it runs: elsewhere, as after a lost host (an
                # allocation of its own is given back for a new one, TorchFT's policy).
                self._placement.release(index)
                old, taken = [], taken | set(old)
            hosts = self._placement.hosts_for(index, old, taken)
        return hosts.spawn_procs(per_host=self._per_group, name=mesh_name, bootstrap=bootstrap)

    def _mark_handled(self, mesh: str) -> None:
        """Failures of ``mesh`` are recovered here: no failure hook hears of them."""
        with self._lock:
            self._handled.append(mesh)
        runtime().supervision.mark_handled(self._hosts._cluster_id, [mesh], f"replica groups {self._name!r}")

    def _hosts_taken(self, but: int | None) -> set[str]:
        """The hosts the groups other than ``but`` run on, and the spare's."""
        taken = {h for g in self.groups if g.index != but for h in hosts_of(g.procs)}
        return taken | set(self.spare.host_ids() if self.spare is not None else ())

    def _spare_hosts(self) -> HostMesh:
        """Free hosts for the warm spare (``hosts_per_group``)."""
        assert self._placement is not None
        return self._placement.hosts_for(SPARE, [], self._hosts_taken(but=None))

    def _tear_down(self, procs: ProcMesh) -> None:
        """Stop ``procs``, blocking (on a lost host: in the background, ``HostPlacement``)."""
        if self._placement is None:
            procs.stop()
        else:
            self._placement.tear_down(procs)

    def _retire(self, group: ReplicaGroup) -> None:
        """Stop ``group``, failed for good, and give its hosts' allocation back (if it has one)."""
        self._tear_down(group.procs)
        self._give_back(group)

    def _give_back(self, group: ReplicaGroup) -> None:
        """Give the allocation of ``group`` (failed for good) back, if it has one; a
        failure to is told in ``status()`` (the cluster's stop ends it anyway)."""
        if self._placement is None:
            return
        try:
            self._placement.release(group.index)
        except Exception as e:  # noqa: BLE001 - the other groups go on
            with self._lock:
                group.last_failure += f"; its allocation could not be given back: {type(e).__name__}: {e}"

    def _take_spare(self, group_index: int) -> ProcMesh | None:
        """The warm spare's procs for group ``group_index``, unless there is none ready or
        it was lost with a host."""
        spare = None if self.spare is None else self.spare.take()
        if spare is None or self._placement is None:
            return spare
        if self._placement.lost() & set(hosts_of(spare)):
            self._placement.tear_down(spare)
            self._placement.release(SPARE)
            return None
        self._placement.took_spare(group_index)
        return spare

    # -- what the training loop uses ---------------------------------------------------
    def healthy(self) -> list[ReplicaGroup]:
        """The groups a step runs on now."""
        with self._lock:  # the loop in a method of its own: see monarch_nb.wire.interrupts
            return self._in_state(GroupState.HEALTHY)

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called (steps failing since are the stop's doing)."""
        return self._stopping

    def _in_state(self, state: GroupState) -> list[ReplicaGroup]:
        """The groups in ``state`` (the caller holds the lock)."""
        return [g for g in self.groups if g.state is state]

    def call(self, endpoint: str, *args: Any, **kwargs: Any) -> dict[int, ValueMesh]:
        """Call ``endpoint`` on every actor of every healthy group, all groups at once;
        returns ``{group index: ValueMesh}`` for the groups whose step succeeded. A group
        whose step fails (a proc died, an endpoint raised, or it took longer than
        ``step_timeout``) is left out of the result and recovered in the background; the
        next calls run on the others. Raises :class:`ClusterError` when no group is
        healthy (every one recovering or failed for good: ``status()`` says why), and
        while :meth:`run`'s loops step the groups (stop them first)."""
        self._refuse_while_looping(f"call({endpoint!r})")
        self._admit_joining()
        groups = self.healthy()
        if not groups:
            raise ClusterError(f"ReplicaGroups {self._name!r}: no healthy replica group to run {endpoint!r} on; "
                               f"status: {self.status()}")
        futures = [(g, getattr(g.actors, endpoint).call(*args, **kwargs)) for g in groups]
        results: dict[int, ValueMesh] = {}
        deadline = None if self._step_timeout is None else time.monotonic() + self._step_timeout
        for group, future in futures:
            try:
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                results[group.index] = future.get(timeout=timeout)
            except STEP_FAILURES as e:
                self._failed(group, why_step_failed(e))
        return results

    def run(self, endpoint: str, *args: Any, **kwargs: Any) -> StepLoops:
        """Start one loop per group that calls ``endpoint(*args, **kwargs)`` on the
        group's actors again and again, each group as fast as it (and its quorum) lets it,
        on a thread of its own; returns the :class:`StepLoops` to watch (``steps``,
        ``last``, ``wait``) and ``stop``. Non-blocking.

        A group whose step fails (as in :meth:`call`) is replaced by its own loop, which
        then goes on stepping; the other groups never wait for it. This is the model
        TorchFT needs (``quorum="torchft"``): its lighthouse forms each quorum from the
        groups that ask, so a replaced group must ask while the healthy ones are asking.
        Under TorchFT leave ``on_join`` out (the Manager heals a joining group from a
        healthy one itself): a donor's step may be waiting for the joining group's quorum.

        Waits first for recoveries that :meth:`call` started. Raises :class:`ClusterError`
        while loops already run, or when no group is healthy."""
        self._refuse_while_looping(f"run({endpoint!r})")
        self.wait_healthy()  # from here on, only the loops replace groups, each its own
        if not self.healthy():
            raise ClusterError(f"ReplicaGroups {self._name!r}: no healthy replica group to run {endpoint!r} on; "
                               f"status: {self.status()}")
        self._loops = StepLoops(self, endpoint, args, kwargs)
        return self._loops

    def _refuse_while_looping(self, what: str) -> None:
        if self._loops is not None and self._loops.running():
            raise ClusterError(f"ReplicaGroups {self._name!r}: {what} while the groups run "
                               f"{self._loops.endpoint!r} loops (run()); stop them first: loops.stop()")

    def step_group(self, group: ReplicaGroup, endpoint: str, args: tuple, kwargs: dict) -> ValueMesh | None:
        """One step of ``group`` alone, on a loop's thread (:class:`StepLoops`; no
        progress bar), waiting up to ``step_timeout``: its result, or ``None`` when the
        step failed (as in :meth:`call`) and the group was replaced on this thread: torn
        down, respawned and, after ``on_join``, ``HEALTHY`` again, unless it failed for
        good (``status()`` says why) or the groups stop."""
        if group.state is not GroupState.HEALTHY:
            return None
        future = getattr(group.actors, endpoint).call(*args, **kwargs)
        try:
            if not runtime().mailbox.wait(future.done, self._step_timeout):
                raise TimeoutError(f"{endpoint} of group {group.index} did not finish within {self._step_timeout} s")
            return future.get(0)
        except STEP_FAILURES as e:
            broken = self._take_out(group, why_step_failed(e))
        if broken is not None:
            self._replace(group, broken)
        return None

    def _replace(self, group: ReplicaGroup, broken: ProcMesh) -> None:
        """Recover ``group`` and admit it, on this thread."""
        failed: ProcMesh | None = broken
        while failed is not None:  # again while its replacement fails before it rejoins
            self._recover(group, failed)
            failed = self._admit(group) if group.state is GroupState.JOINING else None

    def wait_healthy(self, timeout: float | None = None) -> bool:
        """Block until no group is recovering (``timeout`` seconds, ``None``: no limit):
        each respawned, or failed for good after ``max_restarts``; then admit the
        recovered ones. Returns whether every group that is not failed for good is healthy
        again: a group ``FAILED`` (``status()`` says why) does not make it ``False``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for thread in list(self._recoveries):
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            self._admit_joining()  # a replacement whose on_join fails is recovered again
            with self._lock:
                recovering = any(g.state is GroupState.RECOVERING for g in self.groups)
            if not recovering or (deadline is not None and time.monotonic() >= deadline) \
                    or not any(t.is_alive() for t in self._recoveries):
                return not recovering

    def status(self) -> list[dict]:
        """Each group's state, restarts, last failure, recovery times (s), pids and host ids."""
        with self._lock:  # the loop in a method of its own: see monarch_nb.wire.interrupts
            return self._summaries()

    def _summaries(self) -> list[dict]:
        """Each group's :meth:`ReplicaGroup.summary` (the caller holds the lock)."""
        return [g.summary() for g in self.groups]

    def stop(self) -> None:
        """Stop :meth:`run`'s loops (their steps in flight end with the procs), every
        group's procs (a group being respawned: its new procs once started), then the
        lighthouse's. Blocks until all have stopped."""
        with self._lock:
            self._stopping = True
        self._stopped.set()
        if self._loops is not None:
            self._loops.stop(wait=False)
        for group in self.groups:
            self._tear_down(group.procs)
        if self._loops is not None:
            self._loops.join()
        self.wait_healthy()
        for group in self.groups:
            group.state = GroupState.STOPPED
        if self.spare is not None:
            self.spare.stop()
        if self._placement is not None:
            self._placement.stop()  # added allocations given back (their jobs end)
        if self.lighthouse is not None:
            self.lighthouse.stop()
        runtime().supervision.mark_handled(self._hosts._cluster_id, self._handled, None)

    # -- recovery ------------------------------------------------------------------------
    def _admit_joining(self) -> None:
        """Groups respawned since the last step: ``on_join`` from a healthy donor, then in."""
        with self._lock:  # the loop in a method of its own: see monarch_nb.wire.interrupts
            joining = self._in_state(GroupState.JOINING)
        for group in joining:
            broken = self._admit(group)
            if broken is not None:
                self._recover_in_background(group, broken)

    def _admit(self, group: ReplicaGroup) -> ProcMesh | None:
        """``on_join`` for respawned ``group`` from a healthy donor, then ``HEALTHY``.
        When ``on_join`` raises because its donor died (the donor's actors are known gone,
        the group's are not), it runs again from another donor (or ``None``), at no cost
        to the group. When it raises otherwise (the new procs died before the group
        rejoined, or the hook failed), the respawn counts as a restart that failed:
        returns the procs to recover again (``RECOVERING``) while within
        ``max_restarts``, else stops them (``FAILED``). Nothing while the groups stop."""
        if self._stopping:
            return None
        started = time.monotonic()
        tried: list[ReplicaGroup] = []  # donors that died under an on_join
        while True:
            donor = next((g for g in self.healthy() if g not in tried), None)
            try:
                if self._on_join is not None:
                    call_within(self._on_join, (group, donor), self._step_timeout, f"on_join of group {group.index}")
                break
            except Exception as e:  # noqa: BLE001 - the group is recovered again or stays out; the others go on
                if donor is not None and donor.actors._gone_ranks() and not group.actors._gone_ranks():
                    # The donor died under it, not the joining group: no strike on the group;
                    # the join is tried again from another donor (the dead one's own step or
                    # loop finds its failure and recovers it, as any).
                    tried.append(donor)
                    continue
                if self._respawn_failed(group, f"on_join failed: {type(e).__name__}: {e}"):
                    return group.procs
                self._retire(group)
                return None
        with self._lock:
            group.recovery_phases["join"] = time.monotonic() - started
            group.restarts += 1
            group.respawns_failed = 0
            group.recoveries_s.append(time.monotonic() - group.failed_at)
            group.state = GroupState.HEALTHY
        if self.spare is not None:
            self.spare.refill()  # now that the group is back: not competing with its recovery
        return None

    def _failed(self, group: ReplicaGroup, why: str) -> None:
        broken = self._take_out(group, why)
        if broken is not None:
            self._recover_in_background(group, broken)

    def _recover_in_background(self, group: ReplicaGroup, broken: ProcMesh) -> None:
        """:meth:`_recover` on a thread of its own (``wait_healthy`` joins it)."""
        thread = threading.Thread(target=self._recover, args=(group, broken), daemon=True,
                                  name=f"monarch-nb-recover-{self._name}-{group.index}")
        self._recoveries.append(thread)
        thread.start()

    def _take_out(self, group: ReplicaGroup, why: str) -> ProcMesh | None:
        """Mark healthy ``group`` failed; returns its procs to recover, or ``None`` when
        it was not healthy or is past ``max_restarts`` (then stopped, ``FAILED``)."""
        with self._lock:
            if self._stopping or group.state is not GroupState.HEALTHY:
                return None  # stopping: a step fails because its procs were stopped
            group.last_failure = why
            group.strikes += 1
            if group.restarts >= self._max_restarts:
                group.state = GroupState.FAILED
            else:
                group.state = GroupState.RECOVERING
        broken = group.procs
        if group.state is GroupState.FAILED:
            self._retire(group)
            return None
        group.failed_at = time.monotonic()
        return broken

    def _respawn_failed(self, group: ReplicaGroup, why: str) -> bool:
        """Count a replacement of ``group`` that failed before it rejoined as a restart
        (and a strike on its hosts); returns whether it is respawned again (``RECOVERING``:
        within ``max_restarts`` and not stopping), else it is ``FAILED`` with ``why``."""
        with self._lock:
            group.restarts += 1  # this respawn was a restart, though the group never stepped
            group.strikes += 1
            group.respawns_failed += 1
            group.last_failure = why
            retry = not self._stopping and group.restarts < self._max_restarts
            group.state = GroupState.RECOVERING if retry else GroupState.FAILED
        return retry

    def _recover(self, group: ReplicaGroup, broken: ProcMesh) -> None:
        """Tear the group down (its live ranks hold a torch.distributed group that lost a
        member) and start it again, as often as its replacement fails to start within
        ``max_restarts`` (after ``RESPAWN_RETRY_S``, doubling); it joins at the next step
        (``_admit_joining``), unless it failed for good (``FAILED``)."""
        phases: dict[str, float] = {}
        old_hosts = hosts_of(broken)
        try:
            started = time.monotonic()
            self._tear_down(broken)  # a hung rank too: its agent kills what does not exit
            phases["teardown"] = time.monotonic() - started
        except Exception as e:  # noqa: BLE001 - reported in status(), the other groups go on
            with self._lock:
                group.state, group.last_failure = GroupState.FAILED, f"recovery failed: {type(e).__name__}: {e}"
            self._give_back(group)
            return
        while True:
            if group.respawns_failed:
                self._stopped.wait(min(RESPAWN_RETRY_MAX_S, RESPAWN_RETRY_S * 2 ** (group.respawns_failed - 1)))
            if self._stopping:
                return  # stop() sets every group STOPPED
            try:
                procs, actors = self._spawn(group.index, phases, self._take_spare(group.index))
                break
            except Exception as e:  # noqa: BLE001 - counted against max_restarts; the other groups go on
                if not self._respawn_failed(group, f"recovery failed: {type(e).__name__}: {e}"):
                    self._give_back(group)
                    return
        if hosts_of(procs) != old_hosts:
            group.strikes = 0  # on other hosts: it counts again from there
        with self._lock:
            stopping = self._stopping
            if not stopping:
                group.procs, group.actors, group.state = procs, actors, GroupState.JOINING
                group.recovery_phases = phases
        if stopping:  # stop() came while it was being respawned
            procs.stop()
