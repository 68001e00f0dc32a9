"""Actors the benchmarks spawn (importable, so fresh clients and procs find them too)."""

import os
import time

from monarch_nb.actor import Actor, endpoint


class Echo(Actor):
    @endpoint
    def ping(self, x=None):
        return x


class Busy(Actor):
    """Tells its pid, or keeps a call waiting for ``seconds``: what supervision benchmarks kill."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def wait(self, seconds: float) -> None:
        time.sleep(seconds)
