"""A user's hook run within a time bound (``ReplicaGroups``' ``on_join`` under
``step_timeout``): a hook that hangs (a weight copy waiting on a rank stuck in a
collective) must not stall every group's training."""

from __future__ import annotations

import threading
from typing import Any, Callable


def call_within(hook: Callable[..., Any], args: tuple, timeout: float | None, what: str) -> Any:
    """``hook(*args)``, on this thread without ``timeout`` (seconds); with it, on a
    thread of its own, waited for that long. Returns what it returns, raises what it
    raises, or ``TimeoutError`` naming ``what`` when it runs past ``timeout``: it is left
    running then (a daemon thread; its calls end once what it waits on is recovered)."""
    if timeout is None:
        return hook(*args)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = hook(*args)
        except BaseException as e:  # noqa: BLE001 - raised on the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True, name=f"monarch-nb-{what.replace(' ', '-')}")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not finish within step_timeout={timeout} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
