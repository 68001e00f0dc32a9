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

SchedTimes = tuple[float, float, bool]  # seconds run, seconds waited runnable, runnable now


def sched_times(pid: int) -> SchedTimes | None:
    """Of the main thread of process ``pid`` of this machine (Linux): seconds it has run
    on a CPU, seconds it waited runnable for one (a wait counts once it ends), and
    whether it is runnable now (running or waiting); ``None`` where unknown."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            ran, waited = f.read().split()[:2]
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
        return int(ran) / 1e9, int(waited) / 1e9, state == "R"
    except (OSError, ValueError, IndexError):
        return None


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
