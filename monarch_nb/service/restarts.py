"""How often a replica may be replaced, and the names its meshes take over any number of
replacements.

A restart budget counts over a sliding window, as Kubernetes does for a crash-looping
container (its back-off resets once the container has run 10 minutes): a service that
runs for days and loses a replica now and then (an OOM on one long sequence) replaces it
every time, while a replica that fails again and again (bad weights, a request that kills
whatever runs it) is left out once it spends the budget within one window, until the
window frees a restart, when it is tried again (as Kubernetes tries a crash-looping
container again after its back-off): at most ``limit`` starts per window, for ever.
Counted over the service's whole life, as before, occasional failures added up until no
replica was left; left out for good, a burst of them did.
"""

from __future__ import annotations

from collections import deque

# A replica's meshes are named KEY-rIDXgSLOT, SLOT its generation modulo GENERATION_SLOTS:
# one digit however many times it is replaced, so a name that fits a mesh name at the
# service's start fits it for ever. A slot is used again after GENERATION_SLOTS - 1 other
# starts of the replica, long after the hub's news of that older mesh has come in; the
# mesh is spawned with replace=True, so one left registered (a stop that failed, a spawn
# whose answer was lost) is stopped rather than taken as the new one.
GENERATION_SLOTS = 10


def replica_mesh_name(key: str, idx: int, generation: int) -> str:
    """The name of the proc mesh (and actor mesh) of ``generation`` of replica ``idx`` of
    the service ``key``."""
    return f"{key}-r{idx}g{generation % GENERATION_SLOTS}"


def longest_mesh_name(key: str, num_replicas: int) -> str:
    """The longest name any replica of service ``key`` may take (what must fit a mesh
    name)."""
    return replica_mesh_name(key, num_replicas - 1, GENERATION_SLOTS - 1)


class RestartBudget:
    """At most ``limit`` restarts within any ``window_s`` seconds (``None``: within the
    service's whole life). Times are ``time.monotonic()`` seconds. Not thread-safe: the
    service's lock guards it."""

    def __init__(self, limit: int, window_s: float | None):
        self.limit, self.window_s = limit, window_s
        self._times: deque[float] = deque()  # restarts still in the window, oldest first (at most limit)

    def allows(self, now: float) -> bool:
        """Whether a restart at ``now`` stays within the budget."""
        if self.window_s is not None:
            while self._times and self._times[0] <= now - self.window_s:
                self._times.popleft()
        return len(self._times) < self.limit

    def next_allowed(self) -> float | None:
        """When a restart will next be within the budget (monotonic seconds), once it is
        spent now: when its oldest restart leaves the window; ``None`` when never (no
        window, or a limit of 0)."""
        if self.window_s is None or self.limit == 0:
            return None
        return self._times[0] + self.window_s if self._times else 0.0

    def spend(self, now: float) -> None:
        """Count a restart at ``now`` (after :meth:`allows` said yes)."""
        self._times.append(now)
