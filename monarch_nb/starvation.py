"""How much of a peer's silence it spent waiting for a CPU (Linux).

A machine starved of CPU (a load average of 18 on 2 cores) delays every process on it,
and a process's heartbeats most of all: a peer on this machine that was runnable but
not running was not silent by choice, and its silence should not be held against it.
Linux tells how long a task waited runnable for a CPU (``/proc/PID/schedstat``, once
the wait ends) and whether it is runnable now (``/proc/PID/stat``). A stopped
(SIGSTOP), hung or dead process does not wait for a CPU, so all of its silence counts.

Used both ways: the hub excuses a starved host agent (``hub.heartbeats``), and a host
agent a starved hub on its machine (``host.agent``).
"""

from __future__ import annotations

import os

SchedTimes = tuple[float, float, bool]  # seconds run, seconds waited runnable, runnable now


def sched_times(pid: int) -> SchedTimes | None:
    """Of every thread of process ``pid`` of this machine (Linux), together: seconds run
    on a CPU, seconds waited runnable for one (a wait counts once it ends), and whether
    one is runnable now (running or waiting); ``None`` where unknown.

    Every thread, not the main one alone: a thread that holds the GIL and waits for a
    CPU holds up the event loop's thread too, which then sleeps on the GIL (neither
    running nor waiting for a CPU). Counted by the main thread alone, a hub starting 32
    local host agents from a thread of its own was silent for 2 s without a CPU wait to
    excuse it, and its agents stopped every proc (2 runs of 3 on 2 loaded cores)."""
    ran = waited = 0.0
    runnable = False
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                task_ran, task_waited = f.read().split()[:2]
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
        ran += int(task_ran) / 1e9
        waited += int(task_waited) / 1e9
        runnable = runnable or state == "R"
    if not ran and not waited:  # no thread could be read: the process is gone, or /proc says nothing
        return None
    return ran, waited, runnable


def cpu_wait(silent_s: float, then: tuple[float, float], now: SchedTimes) -> float:
    """How much of ``silent_s`` seconds of silence a process spent waiting for a CPU,
    from its ``sched_times`` when last heard (``then``: the first two) and ``now``: the
    waits that ended meanwhile, or, while it is runnable, all of it that it did not run."""
    ran, waited = now[0] - then[0], now[1] - then[1]
    return max(waited, silent_s - ran) if now[2] else waited


def counted_silence(silent_s: float, waited_s: float) -> float:
    """The part of ``silent_s`` seconds of silence that counts against a peer: what it
    did not spend waiting for a CPU (``waited_s`` of it)."""
    return silent_s - max(0.0, waited_s)


class Watched:
    """One peer process on this machine whose silence is excused while it waits for a
    CPU: :meth:`heard` when a message of its comes, :meth:`counted` for how much of a
    silence counts. A peer on another machine (``pid`` ``None``) is never excused."""

    def __init__(self):
        self.pid: int | None = None
        self._at_heard: tuple[float, float] | None = None

    def heard(self, pid: int | None) -> None:
        """A message of the peer arrived; ``pid``: its process on this machine, or ``None``."""
        self.pid = pid
        times = sched_times(pid) if pid is not None else None
        self._at_heard = times[:2] if times is not None else None

    def counted(self, silent_s: float) -> float:
        """The part of ``silent_s`` seconds of silence since it was last heard that counts."""
        then = self._at_heard
        now = sched_times(self.pid) if self.pid is not None and then is not None else None
        if then is None or now is None:
            return silent_s
        return counted_silence(silent_s, cpu_wait(silent_s, then, now))
