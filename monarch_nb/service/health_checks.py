"""Health checks of a service's replicas, as Ray Serve's ``health_check_period_s`` and
``health_check_timeout_s``: every period, each proc of each healthy replica is asked for
its status; a replica with a proc that does not answer within the timeout is failed,
and replaced like one whose proc died.

Supervision tells a service of procs that exit. A proc that lives but no longer answers
(SIGSTOPped, stuck in C code that holds the GIL, swapping) is not dead: without a
check, the replica stayed healthy, a share of the routes went to it and waited for
ever. The status request goes to the proc's control thread, not to its actors: an
endpoint busy for minutes does not fail it.
"""

from __future__ import annotations

import threading
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Hashable

from ..client.runtime import runtime
from ..protocol import envelope, proc_ops
from ..wire.mailbox import Gather
from .defaults import HEALTH_CHECK_PERIOD_S as PERIOD_S
from .defaults import HEALTH_CHECK_TIMEOUT_S as TIMEOUT_S


@dataclass(frozen=True)
class Target:
    """A proc to check: ``key`` names its replica's start (what a failure is for)."""

    key: Hashable
    address: str  # the proc's control inbox
    what: str  # "proc NAME/RANK (pid N)"


class HealthChecks:
    """Runs the checks on a daemon thread until ``stopped()``. ``targets()`` gives the
    procs to ask now; ``failed(key, why)`` fails the replica start ``key`` (it decides
    whether that is still news); ``pause(seconds)`` waits, returning early once the
    service stops."""

    def __init__(self, name: str, cluster_id: str, period_s: float, timeout_s: float,
                 targets: Callable[[], list[Target]], failed: Callable[[Any, str], None],
                 stopped: Callable[[], bool], pause: Callable[[float], None]):
        self.period_s, self.timeout_s = period_s, timeout_s
        self._cluster_id = cluster_id
        self._targets, self._failed, self._stopped, self._pause = targets, failed, stopped, pause
        self.rounds = 0  # checks done (for tests and metrics)
        self.thread = threading.Thread(target=self._run, name=f"monarch-nb-service-{name}-health", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        while not self._stopped():
            self._pause(self.period_s)
            if self._stopped():
                return
            try:
                self.check()
            except Exception:  # noqa: BLE001 - a round that failed (the cluster going away): the next may not
                traceback.print_exc()

    def check(self) -> None:
        """One round: ask every target at once, then fail the replicas of those that did
        not answer within the timeout."""
        targets = self._targets()
        if targets:
            with Gather(runtime().mailbox) as gather:
                for i, target in enumerate(targets):
                    gather.request(target.address, self._cluster_id, {envelope.OP: proc_ops.STATUS}, key=i)
                gather.wait(len(targets), self.timeout_s)
                answered = set(gather.replies)
            silent: dict[Any, list[str]] = {}
            for i, target in enumerate(targets):
                if i not in answered:
                    silent.setdefault(target.key, []).append(target.what)
            for key, procs in silent.items():
                self._failed(key, f"{', '.join(procs)} did not answer a health check within {self.timeout_s:g} s "
                                  "(stopped, or stuck holding the GIL)")
        self.rounds += 1
