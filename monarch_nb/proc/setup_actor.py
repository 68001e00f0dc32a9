"""The actor behind ``spawn_procs(bootstrap=..., proc_bind=...)`` and
``ProcMesh.logging_option(level=...)``: it runs once in every proc of a mesh (for a
new mesh, before the user's actors) to pin the proc to CPUs and run a setup function."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from pathlib import Path
from typing import Callable

from .actor import Actor, current_rank, unowned

# Monarch's binding keys (numactl/taskset options). What can't be honoured without
# numactl, memory policy, is refused at spawn_procs rather than silently ignored.
CPU_KEYS = ("cpus", "physcpubind", "cpunodebind")
NODE_DIR = Path("/sys/devices/system/node")


def parse_cpu_list(text: str) -> set[int]:
    """The CPUs of a kernel CPU list such as ``"0-3,8,10-11"``; ``ValueError`` if malformed."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def check_bind(proc_bind: list[dict[str, str]], procs_per_host: int) -> None:
    """``ValueError`` unless ``proc_bind`` has one binding per proc of a host, each using
    only keys monarch_nb applies (``cpus``/``physcpubind``: a CPU list, ``cpunodebind``:
    NUMA nodes whose CPUs the proc may use)."""
    if len(proc_bind) != procs_per_host:
        raise ValueError(f"proc_bind length ({len(proc_bind)}) must equal procs_per_host ({procs_per_host})")
    for bind in proc_bind:
        unknown = sorted(set(bind) - set(CPU_KEYS))
        if unknown:
            raise ValueError(f"proc_bind key(s) {', '.join(unknown)} are not supported: monarch_nb binds CPUs "
                             f"only ({', '.join(CPU_KEYS)})")
        for key, value in bind.items():
            try:
                parse_cpu_list(value)
            except (ValueError, AttributeError):
                raise ValueError(f"proc_bind {key}={value!r}: give a list such as '0-3,8' (a string)") from None


def _cpus_of(bind: dict[str, str]) -> set[int] | None:
    """The CPUs ``bind`` allows (all of its keys at once); ``None`` for no binding."""
    cpus: set[int] | None = None
    for key, value in bind.items():
        if key == "cpunodebind":
            wanted = set().union(*((parse_cpu_list((NODE_DIR / f"node{n}" / "cpulist").read_text()))
                                   for n in parse_cpu_list(value)))
        else:
            wanted = parse_cpu_list(value)
        cpus = wanted if cpus is None else cpus & wanted
    return cpus


def _pin_process(cpus: set[int]) -> None:
    """Pin every thread of this process (Linux affinity is per thread; threads started
    later inherit it from the one that starts them)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # a thread that just ended
            pass


def set_root_log_level(level: int) -> None:
    """A setup function: the proc's root logger passes records of ``level`` and above."""
    logging.getLogger().setLevel(level)


class ProcSetup(Actor):
    """``__init__`` pins this proc to the CPUs of its entry of ``proc_bind`` (indexed by
    the proc's place on its host: its rank modulo ``procs_per_host``), then runs
    ``bootstrap()`` (awaiting it when it is a coroutine function). What ``bootstrap``
    spawns belongs to the cluster, not to this actor, so it outlives it. What it raises
    (or a binding this host can't apply, e.g. a missing NUMA node) fails the spawn of
    this actor, which the client reports on ``ProcMesh.initialized``."""

    def __init__(self, proc_bind: list[dict[str, str]] | None, procs_per_host: int,
                 bootstrap: Callable[[], object] | None):
        cpus = None if proc_bind is None else _cpus_of(proc_bind[current_rank().rank % procs_per_host])
        if cpus is not None:
            _pin_process(cpus)
        if bootstrap is not None:
            with unowned():
                result = bootstrap()
                if inspect.isawaitable(result):
                    asyncio.run(_awaited(result))


async def _awaited(awaitable):
    return await awaitable
