"""Actors the benchmarks spawn (importable, so fresh clients and procs find them too)."""

import gc
import importlib
import os
import time

import psutil

from monarch_nb.actor import Actor, endpoint


class Echo(Actor):
    @endpoint
    def ping(self, x=None):
        return x

    @endpoint
    def loop_module(self) -> str:
        """The module whose loop serves this actor (``bench/bare_actor_loop.py`` replaces it)."""
        from monarch_nb.proc.actor_loop import ActorThread

        return ActorThread._serve.__module__


class Busy(Actor):
    """Tells its pid, or keeps a call waiting for ``seconds``: what supervision benchmarks kill."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def wait(self, seconds: float) -> None:
        time.sleep(seconds)


class Collector(Actor):
    """A full garbage collection in its proc: what it costs and leaves private."""

    @endpoint
    def collect(self, modules: str = "") -> dict:
        for name in filter(None, modules.split(",")):  # what a forked proc had preloaded
            importlib.import_module(name)
        started = time.thread_time()
        gc.collect()
        took = time.thread_time() - started
        memory = psutil.Process().memory_full_info()
        return {"gc_cpu_ms": took * 1e3, "uss_mib": memory.uss / (1 << 20), "pss_mib": memory.pss / (1 << 20)}
