"""The states and kinds that cross process boundaries, each spelled once: health
states of the health tree's nodes, what an actor is doing (a proc's ``status``), what
is known of a cluster directory (discovery), and the kinds of supervision failures.

Each is a ``str``-valued enum: a member equals its string (``HealthState.BUSY ==
"busy"``), hashes like it, prints and formats as it and goes into JSON as it, so trees
and events read by older code, by JSON and by a user's script keep working. Code
outside ``protocol/`` names the members, never the strings (``tests/test_hygiene.py``).

States that never leave one process stay local enums beside their owner:
``service.replica.ReplicaState`` (a service's replica, kept by the routing client) and
``ft.replica_groups.GroupState`` (a replica group, kept by its controller).
"""

from __future__ import annotations

import enum


class _Spelled(str, enum.Enum):
    """A member is its value wherever a string is expected (``str()``, f-strings, JSON),
    on every Python this package supports (3.11 changed ``str()`` of mixed-in enums)."""

    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]  # str's, on purpose


class HealthState(_Spelled):
    """The state of a node of the health tree (``hub.health``), worst first for procs:
    ``FAILED`` (exited or killed), ``LOST`` (its host agent fell silent),
    ``UNRESPONSIVE`` (alive, its control loop did not answer), ``PAUSED`` (an actor in
    the debugger), ``BUSY`` (an actor runs an endpoint), ``HEALTHY`` (running, idle).
    ``STARTING``: a proc mesh being spawned; ``DEGRADED``: a cluster with a proc or
    host down; ``STOPPED``: a service replica with no procs now."""

    HEALTHY = "healthy"
    BUSY = "busy"
    PAUSED = "paused"
    STARTING = "starting"
    UNRESPONSIVE = "unresponsive"
    LOST = "lost"
    FAILED = "failed"
    DEGRADED = "degraded"
    STOPPED = "stopped"


# Procs' states, worst first: a node made of procs is as bad as its worst.
PROC_ORDER = (HealthState.FAILED, HealthState.LOST, HealthState.UNRESPONSIVE, HealthState.PAUSED,
              HealthState.BUSY, HealthState.HEALTHY)
DOWN = (HealthState.FAILED, HealthState.LOST)  # no longer running: counted as failed
AT_WORK = (HealthState.PAUSED, HealthState.BUSY)  # running, doing something; the first wins


class Activity(_Spelled):
    """What one actor is doing, in a proc's ``status`` reply (``proc.actor_loop``):
    ``IDLE``, ``BUSY`` (with ``endpoint`` and ``since``) or ``PAUSED`` in the debugger
    (with where, and ``since``)."""

    IDLE = "idle"
    BUSY = "busy"
    PAUSED = "paused"


class DiscoveryState(_Spelled):
    """What is known of a cluster's directory (``client.discovery.probe``): ``RUNNING``
    (its hub answered), ``STARTING`` (a client is starting its hub), ``STALE`` (a hub
    that is gone or does not answer; the probe's reason says why), ``MISSING``."""

    RUNNING = "running"
    STARTING = "starting"
    STALE = "stale"
    MISSING = "missing"


class FailureKind(_Spelled):
    """The ``kind`` of a supervision failure event (``errors.SupervisionError.kind``):
    ``PROC_FAILED`` (a proc exited, was killed or was lost with its host),
    ``ACTOR_FAILED`` (an actor died while its proc lives on), ``ENDPOINT_FAILED`` (a
    ``broadcast`` endpoint raised, with nobody to reply to)."""

    PROC_FAILED = "proc_failed"
    ACTOR_FAILED = "actor_failed"
    ENDPOINT_FAILED = "endpoint_failed"


STATE = "state"  # the key of a node's (or an actor's status's) state
