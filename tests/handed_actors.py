"""Actors for tests/test_handed_meshes.py (importable by the procs)."""

from __future__ import annotations

import os

from monarch_nb.actor import Actor, endpoint

BOUND_S = 60


def _outcome(call) -> str:
    try:
        return f"returned {call()}"
    except Exception as e:  # noqa: BLE001 - what the caller got is what the test checks
        return f"raised {type(e).__name__}"


class Child(Actor):
    @endpoint
    def die(self) -> None:
        os._exit(3)

    @endpoint
    def ping(self) -> str:
        return "pong"


class Caller(Actor):
    """Calls a mesh it was handed as an argument; never calls this_host()."""

    @endpoint
    def call(self, child, endpoint_name: str) -> str:
        return _outcome(lambda: getattr(child, endpoint_name).call().get(timeout=BOUND_S).values())


class AsyncCaller(Actor):
    @endpoint
    async def call(self, child, endpoint_name: str) -> str:
        try:
            return f"returned {(await getattr(child, endpoint_name).call()).values()}"
        except Exception as e:  # noqa: BLE001
            return f"raised {type(e).__name__}"
