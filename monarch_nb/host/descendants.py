"""A proc's descendants end with it.

What an actor starts (a ``sleep``, a shell with children of its own, a child that
ignores SIGTERM, a daemon) would otherwise outlive its proc: a process's death is not
its children's. Three things tie them to the proc:

- each proc leads its own process group (and session), which what it starts joins
  unless it makes its own;
- each proc's environment names it (``PROC_ID_ENV``), and what it starts inherits
  that, also a process that left the group (``setsid``, a daemon);
- the host agent is a *child subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``): a
  descendant whose parent died is re-parented to the agent, not to init, so it stays
  among the agent's descendants, where :func:`end` finds it, and the agent reaps it.

When a proc has ended (stopped, killed, crashed), :func:`end` sends SIGTERM to what is
left of it and SIGKILL after a grace. Under Slurm the job's cgroup covers the rest.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys

import psutil

PROC_ID_ENV = "MONARCH_NB_PROC_ID"  # set in each proc's environment by its host agent
_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Make this process the one orphaned descendants are re-parented to (Linux; a
    no-op elsewhere, where only the process group ties descendants to their proc)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except OSError:
            pass


def _belongs(process: psutil.Process, proc_id: str, pgid: int) -> bool:
    try:
        if os.getpgid(process.pid) == pgid:
            return True
        return process.environ().get(PROC_ID_ENV) == proc_id
    except (OSError, psutil.Error):  # gone meanwhile, a zombie, or not ours to read
        return False


def _children() -> set[int] | None:
    """This process's children, read cheaply from ``/proc`` (Linux); ``None`` where
    that is not possible."""
    children: set[int] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                children.update(int(pid) for pid in f.read().split())
    except (OSError, ValueError):
        return None
    return children


def _may_have_left(pgid: int, procs: set[int]) -> bool:
    """Cheap test before the costly scan of every process: an exited proc left nothing
    when its group is empty and this process has no children but procs (what a proc
    left behind is in its group or re-parented here)."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        pass
    except OSError:
        return True
    children = _children()
    return children is None or bool(children - procs)


def of_proc(proc_id: str, pgid: int, procs: set[int]) -> list[psutil.Process]:
    """This process's descendants left by proc ``proc_id`` (group ``pgid``), the pids
    in ``procs`` (live procs) aside."""
    if not _may_have_left(pgid, procs):
        return []
    try:
        found = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in found if p.pid not in procs and _belongs(p, proc_id, pgid)]


async def end(proc_id: str, pgid: int, procs: set[int], grace_s: float) -> int:
    """End every descendant proc ``proc_id`` (which has exited) left behind: SIGTERM,
    then SIGKILL for those alive after ``grace_s`` seconds. Returns once all have
    exited, the ones that were this process's children reaped; returns how many there
    were. ``procs``: pids of live procs, never touched."""
    left = of_proc(proc_id, pgid, procs)
    if not left:
        return 0
    for process in left:
        try:
            process.terminate()
        except psutil.Error:
            pass
    loop = asyncio.get_running_loop()
    # psutil.wait_procs reaps the ones that are our children (orphans re-parented here).
    _, alive = await loop.run_in_executor(None, psutil.wait_procs, left, grace_s)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass
    if alive:
        await loop.run_in_executor(None, psutil.wait_procs, alive, grace_s)
    return len(left)


def reap_orphans(procs: set[int]) -> None:
    """Reap this process's children that exited and are not procs (``procs``: their
    pids): orphans re-parented here, which would otherwise stay zombies."""
    children = _children()
    if children is None:
        try:
            children = {p.pid for p in psutil.Process().children()}
        except psutil.Error:
            return
    for pid in children - procs:  # asyncio's child watcher reaps procs, with their exit code
        try:
            os.waitpid(pid, os.WNOHANG)  # reaps it if it has exited; a live one is left alone
        except OSError:
            pass
