"""Record layouts and exit causes shared by the hub, host agents and clients."""

from __future__ import annotations

import signal

# A log record, as the hub stores it and sends it to clients: a tuple in this order.
# ``seq`` counts from 1 in arrival order; ``mesh``/``rank`` name the actor that printed
# (``size``: its mesh's number of actors), or the proc mesh and proc rank for output not
# written by an actor (``size`` then ``None``); ``origin`` is ``CLIENT_ID:...`` of the
# call that caused the line, or ``None``.
LOG_FIELDS = ("seq", "time", "host", "proc", "stream", "mesh", "rank", "origin", "text", "size")

LOST_EXIT_CODE = -255  # exit code recorded for a proc lost with its host or while no hub watched


def exit_cause(code: int | None) -> str:
    """``-9`` -> ``"killed by SIGKILL"``, ``3`` -> ``"exited with code 3"``."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def proc_failure_status(code: int | None) -> str | None:
    """Monarch's words for how an actor's proc failed, which programs written for Monarch
    match: ``-9`` -> ``"the process this actor was running on failed: Killed(sig=9)"``,
    ``3`` -> ``"the process this actor was running on exited with non-zero code 3"``;
    ``None`` when it did not fail (still running, exit 0) or was lost (no status known)."""
    if code is None or code == 0 or code == LOST_EXIT_CODE:
        return None
    if code < 0:
        return f"the process this actor was running on failed: Killed(sig={-code})"
    return f"the process this actor was running on exited with non-zero code {code}"
