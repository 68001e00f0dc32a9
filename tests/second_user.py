"""Attacks run as another local user: a forked child of the test that drops to
``OTHER_USER``'s uid and gids before it runs the attack, so the kernel sees a second
user (what ``/proc``, socket peers and file modes check), while the child keeps the
modules the test already imported (that user can't read the venv's interpreter under
``/root``).

Needs root (to switch users) and the user itself (``.ci/setup.d/40-second-user.sh``
adds it); without either the test is skipped, saying what is missing (failed in CI).
"""

from __future__ import annotations

import os
import pickle
import pwd
import select
import signal
import traceback
from typing import Any, Callable

from conftest import system_part_missing

OTHER_USER = "monarchnb-other"


def other_user() -> pwd.struct_passwd:
    """The second user's passwd entry, or skip (fail in CI) when it can't be used here."""
    if os.geteuid() != 0:
        system_part_missing("attacks as a second local user need root to switch to it")
    try:
        return pwd.getpwnam(OTHER_USER)
    except KeyError:
        system_part_missing(f"no local user {OTHER_USER!r} to attack as (bash .ci/setup.d/40-second-user.sh adds it)")
        raise  # not reached: system_part_missing raises


def run_as_other_user(attack: Callable[..., Any], *args: Any, timeout: float = 60.0) -> Any:
    """Run ``attack(*args)`` in a child process of ``OTHER_USER`` and return what it
    returned (it must be picklable). An exception in the attack is raised here as
    ``AssertionError`` with the child's traceback; a child still running after
    ``timeout`` seconds is killed and ``TimeoutError`` raised."""
    user = other_user()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            try:
                outcome = ("ok", attack(*args))
            except BaseException:  # noqa: BLE001 - reported to the test
                outcome = ("error", traceback.format_exc())
            with os.fdopen(write_end, "wb") as out:
                pickle.dump(outcome, out)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    data = bytearray()
    try:
        with os.fdopen(read_end, "rb") as pipe:
            while True:
                ready, _, _ = select.select([pipe], [], [], timeout)
                if not ready:
                    os.kill(pid, signal.SIGKILL)
                    raise TimeoutError(f"the attack as {OTHER_USER} ran past {timeout} s")
                chunk = os.read(pipe.fileno(), 1 << 16)
                if not chunk:
                    break
                data += chunk
    finally:
        os.waitpid(pid, 0)
    if not data:
        raise AssertionError(f"the attack as {OTHER_USER} ended without a result")
    kind, value = pickle.loads(bytes(data))
    if kind == "error":
        raise AssertionError(f"the attack as {OTHER_USER} raised:\n{value}")
    return value


def loopback_listeners() -> set[tuple[int, int]]:
    """``(port, inode)`` of every TCP socket listening on 127.0.0.1 or [::1], as any user
    reads them from ``/proc/net/tcp`` and ``/proc/net/tcp6`` (what an attacker scans)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            address, port = local.rsplit(":", 1)
            if state == "0A" and address in ("0100007F", "00000000000000000000000001000000"):
                found.add((int(port, 16), inode))
    return found


def listeners_of(pid: int) -> set[int]:
    """Loopback TCP ports on which process ``pid`` (any of its threads' fds) listens:
    its socket inodes matched against :func:`loopback_listeners` (needs to read
    ``/proc/PID/fd``: run as root, i.e. the test)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:["):-1]))
    return {port for port, inode in loopback_listeners() if inode in inodes}
