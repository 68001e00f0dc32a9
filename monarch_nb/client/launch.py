"""Starting a cluster's hub process and waiting until it is ready."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

from ..errors import ClusterError

HUB_START_TIMEOUT_S = 60.0
HUB_LOG = "hub.log"  # a retained hub's stdout and stderr (its host agents' and procs' too)


def launch_hub(path: Path, *, hosts: int, grace_s: float, ephemeral_parent: int | None = None,
               idle_timeout: float | None = None, recover: bool = False, allocator: dict | None = None,
               timeout: float = HUB_START_TIMEOUT_S) -> subprocess.Popen | None:
    """Start the hub of the cluster at ``path`` and return once it and its host agents
    are up (or re-adopted, with ``recover``).

    With ``ephemeral_parent`` the hub is a child of this process and dies with it; the
    ``Popen`` is returned. Otherwise it is detached (re-parented, output to ``hub.log`` in
    the cluster directory) and ``None`` is returned. Either way it runs in a session of
    its own: a signal to this process's group (a terminal's Ctrl-C, or Jupyter's Kernel →
    Interrupt, which signals the kernel's whole process group) reaches the client alone,
    which decides what to interrupt, and would otherwise stop the cluster. ``allocator``: the
    allocator's spec (default: local host agents). Raises :class:`ClusterError`, with
    the end of the hub's output, when the hub does not report ready within
    ``timeout`` seconds."""
    argv = [sys.executable, "-m", "monarch_nb.hub", "--cluster-dir", str(path), "--hosts", str(hosts),
            "--grace", str(grace_s)]
    if ephemeral_parent is not None:
        argv += ["--ephemeral-parent", str(ephemeral_parent)]
    else:
        argv += ["--detach"]
    if idle_timeout is not None:
        argv += ["--idle-timeout", str(idle_timeout)]
    if recover:
        argv += ["--recover"]
    if allocator is not None:
        argv += ["--allocator", json.dumps(allocator)]
    read_fd, write_fd = os.pipe()
    log = None
    try:
        if ephemeral_parent is None:
            log = open(path / HUB_LOG, "ab")
        argv += ["--ready-fd", str(write_fd)]
        hub = subprocess.Popen(argv, pass_fds=(write_fd,), stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT if log else None,
                               start_new_session=True)
    finally:
        os.close(write_fd)
        if log is not None:
            log.close()
    try:
        # poll, not select: a client holding over 1,024 files (a socket per actor it
        # calls) gets a pipe select() can't watch ("filedescriptor out of range").
        waiting = select.poll()
        waiting.register(read_fd, select.POLLIN)
        ready = bool(waiting.poll(timeout * 1000))
        line = os.read(read_fd, 64) if ready else b""
    finally:
        os.close(read_fd)
    if line.strip() == b"ready":
        if ephemeral_parent is not None:
            return hub
        hub.wait()  # the detaching parent; the hub itself runs on
        return None
    timed_out = not ready
    if hub.poll() is None:
        hub.kill()
    hub.wait()
    # Else the pipe was closed unread: the hub (retained: its detached child) gave up.
    why = f"did not become ready within {timeout:.0f} s" if timed_out else "could not start"
    raise ClusterError(f"cluster {path.name} {why}{_log_tail(path)}")


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = (path / HUB_LOG).read_text(errors="replace")
    except OSError:
        return "; see its stderr above"
    tail = "\n".join(text.splitlines()[-lines:])
    return f"; the end of {path / HUB_LOG}:\n{tail}" if tail else ""
