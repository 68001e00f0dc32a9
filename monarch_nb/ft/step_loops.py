"""Each replica group stepping on its own (``ReplicaGroups.run``): one loop per group, on
a thread of its own, calls an endpoint on the group's actors again and again, as fast as
the group and its quorum let it, while the program watches the steps. A failed group's
loop replaces the group and goes on; the others never wait for it.

This is TorchFT's model: its lighthouse forms each step's quorum from the groups that ask,
so a respawned group must ask while the healthy groups are asking too. Under lock-step
calls (``ReplicaGroups.call``) the healthy groups' requests had all been answered by the
time the respawned group asked, and it waited out its quorum timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..client.value_mesh import ValueMesh

if TYPE_CHECKING:
    from .replica_groups import ReplicaGroup, ReplicaGroups


class StepLoops:
    """The loops of ``ReplicaGroups.run(endpoint, *args, **kwargs)``.

    ``steps``: ``{group index: steps that returned}`` (a replaced group's count goes on);
    ``failed``: ``{group index: steps that failed}`` (the step in flight when its group
    failed: its work is lost; a step ended by :meth:`stop` or ``ReplicaGroups.stop()`` is
    not counted); ``last``: ``{group index: ValueMesh}`` of each group's latest step. They
    change under the loops' threads; read them in :meth:`wait`'s condition, or copy them."""

    def __init__(self, groups: ReplicaGroups, endpoint: str, args: tuple, kwargs: dict):
        self.endpoint = endpoint
        self._groups, self._args, self._kwargs = groups, args, kwargs
        self._changed = threading.Condition()
        self._stopping = False
        self.steps: dict[int, int] = {g.index: 0 for g in groups.groups}
        self.failed: dict[int, int] = {g.index: 0 for g in groups.groups}
        self.last: dict[int, ValueMesh] = {}
        self._threads = {g.index: threading.Thread(target=self._loop, args=(g,), daemon=True,
                                                   name=f"monarch-nb-steps-{endpoint}-{g.index}")
                         for g in groups.groups}
        for thread in self._threads.values():
            thread.start()

    def running(self) -> list[int]:
        """The indices of the groups whose loop still runs (a group failed for good, or
        stopped, has none)."""
        return [i for i, t in self._threads.items() if t.is_alive()]

    def wait(self, condition: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block until ``condition()`` is true, checked after every step of any group and
        whenever a loop ends (``timeout`` seconds, ``None``: no limit); returns it."""
        with self._changed:
            return self._changed.wait_for(condition, timeout)

    def stop(self, wait: bool = True, timeout: float | None = None) -> bool:
        """Ask every loop to end after its step in flight; with ``wait``, block until they
        have (``timeout`` seconds). Returns whether every loop has ended. Under TorchFT a
        step in flight may wait for a quorum the stopped groups no longer join (up to the
        Manager's ``quorum_timeout``); ``ReplicaGroups.stop()`` ends such steps at once."""
        self._stopping = True
        return self.join(timeout) if wait else not self.running()

    def join(self, timeout: float | None = None) -> bool:
        """Block until every loop has ended (``timeout`` seconds); returns whether they have."""
        for thread in self._threads.values():
            thread.join(timeout)
        return not self.running()

    def _loop(self, group: ReplicaGroup) -> None:
        try:
            while self._step(group):
                pass
        finally:
            self._notify()

    def _step(self, group: ReplicaGroup) -> bool:
        """One step of ``group`` (or its replacement); whether its loop goes on."""
        if self._stopping or not group.is_healthy:
            return False
        result = self._groups.step_group(group, self.endpoint, self._args, self._kwargs)
        if result is None:  # replaced (healthy again), failed for good, or stopping
            with self._changed:
                if not self._stopping and not self._groups.stopping:
                    self.failed[group.index] += 1
                self._changed.notify_all()
            return group.is_healthy
        self._record(group.index, result)
        return True

    def _record(self, index: int, result: Any) -> None:
        with self._changed:
            self.steps[index] += 1
            self.last[index] = result
            self._changed.notify_all()

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()
