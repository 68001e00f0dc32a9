"""The open-file limit (``RLIMIT_NOFILE``) of a cluster's processes.

Every proc costs descriptors in each process that deals with it: its host agent holds
its three output pipes and its connection, the hub and a client a socket and a
connection to it once they talk to it (measured: ~4 each; 256 procs took ~1,022 in the
hub, 1,040 in the agent, 791 in the client). The common soft limit of 1,024 so ended a
cluster at ~250 procs, after a minute, with "Too many open files" only in ``hub.log``.

So every process of a cluster raises its soft limit to its hard one when it starts
(:func:`raise_soft_limit`: anyone may, up to the hard limit), and a spawn that would
not fit under what is left is refused at once by the process that would run out,
saying its limit and how to raise the hard one (:func:`spawn_problem`).
"""

from __future__ import annotations

import os
import resource

PER_PROC = 4  # descriptors a proc costs its host agent, the hub and a client (measured, above)
BASE = 64  # a process's own: Python, zmq's context and sockets, log files, clients' connections
# A soft limit raised this far is plenty (16k procs per process) without handing every
# proc, and the programs it starts, a limit of millions: some close every descriptor up
# to the limit one by one when they start.
RAISE_TO_AT_MOST = 65536
HOW_TO_RAISE = ("raise the hard limit where the cluster starts (`ulimit -Hn 65536` as root; `nofile` in "
                "/etc/security/limits.conf for logins, `LimitNOFILE=` for a systemd service, `--ulimit "
                "nofile=65536` for docker) and start the cluster again; monarch_nb raises each process's "
                "soft limit to the hard one by itself")


def limits() -> tuple[int, int]:
    """This process's (soft, hard) limit on open files; ``resource.RLIM_INFINITY`` for none."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def raise_soft_limit() -> tuple[int, int]:
    """Raise this process's soft limit on open files to its hard limit (at most
    ``RAISE_TO_AT_MOST``; never lowers it); children started afterwards inherit it.
    Returns the (soft, hard) limits now. Never raises: where the system refuses, the
    limit stays as it was (and :func:`spawn_problem` says so at spawn). Does not block."""
    soft, hard = limits()
    if soft == resource.RLIM_INFINITY:
        return soft, hard
    target = RAISE_TO_AT_MOST if hard == resource.RLIM_INFINITY else min(hard, RAISE_TO_AT_MOST)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):  # e.g. macOS refuses more than OPEN_MAX: keep what there is
            pass
    return limits()


def open_count() -> int | None:
    """How many descriptors this process has open; ``None`` where that can't be read."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return None


def spawn_problem(who: str, existing: int, new: int, soft: int | None = None, hard: int | None = None,
                  open_now: int | None = None) -> str:
    """Why ``who`` (this process, e.g. ``"host agent host0"``), dealing with ``existing``
    procs, can't take ``new`` more under its open-file limit, naming the limit and how
    to raise it; ``""`` when they fit. ``soft``, ``hard`` and ``open_now`` default to this
    process's (given, for tests). Does not block."""
    if soft is None or hard is None:
        soft, hard = limits()
    if soft == resource.RLIM_INFINITY:
        return ""
    if open_now is None:
        open_now = open_count() or 0
    # Sockets to procs are made when first used: count every proc, also those not yet talked to.
    needed = max(open_now + PER_PROC * new, BASE + PER_PROC * (existing + new))
    if needed <= soft:
        return ""
    most = max(0, (soft - max(open_now, BASE)) // PER_PROC - existing)
    hard_text = "no hard limit" if hard == resource.RLIM_INFINITY else f"hard limit {hard:,}"
    return (f"{who} can't hold {new} more procs under its limit of {soft:,} open files (RLIMIT_NOFILE, "
            f"{hard_text}): {existing + new} procs need about {needed:,} there (~{PER_PROC} each), room is "
            f"left for {most} more; {HOW_TO_RAISE}")


def near_limit(margin: float = 0.9) -> str:
    """``" (its open files: N of a limit of M)"``, when this process has used more than
    ``margin`` of its open-file limit (a failure then likely came from it), else ``""``."""
    soft, _ = limits()
    now = open_count()
    if now is None or soft == resource.RLIM_INFINITY or now < margin * soft:
        return ""
    return f" (its open files: {now:,} of a limit of {soft:,}; {HOW_TO_RAISE})"
