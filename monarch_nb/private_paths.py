"""Whether a folder is this user's alone: no other local user can write in it, or in a
folder above it, and so none can swap, plant or read what is written there.

A cluster's key lives in ``cluster.json`` under ``MONARCH_NB_HOME``; a home that another
user made first (a fixed path under ``/tmp``, as a test run's often is), or one whose
parent another user may write, lets that user replace ``clusters/NAME`` with a folder
of theirs for a moment and take the key from what the hub writes there, or hand a client
a ``cluster.json`` of theirs: then their code runs in this user's processes. OpenSSH's
``StrictModes`` refuses such paths for ``authorized_keys``, by the same rules: every
folder from the root down is owned by root or this user, and writable by no one else
unless sticky (``/tmp``: others may not rename or remove what is ours there); a link on
the way is owned by root or this user; the folder itself is this user's, and only its
group may also write in it when that group is this user's own (a user private group,
which umask 002 systems make folders group-writable for).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path


def not_private(folder: os.stat_result, path: str) -> str | None:
    """What makes the folder ``path`` (its ``stat``) unsafe to write or remove in, or
    None: it belongs to another user, or others than its owner may write in it (its
    group may, when that group is the owner's own: :func:`_own_group`)."""
    if folder.st_uid != os.geteuid():
        return f"{path} belongs to another user ({_user(folder.st_uid)}, uid {folder.st_uid})"
    if folder.st_mode & stat.S_IWOTH or (folder.st_mode & stat.S_IWGRP and not _own_group(folder.st_gid)):
        return f"{path} may be written by other users (mode {stat.S_IMODE(folder.st_mode):o})"
    return None


def unsafe_folder(path: Path) -> str | None:
    """What lets another local user change the existing folder ``path`` or any folder
    above it (see the module docstring), or None. Raises ``OSError`` when it can't be
    looked at."""
    me = os.geteuid()
    written = Path(os.path.abspath(path))
    for part in (*reversed(written.parents), written):  # links on the way, as written
        st = os.lstat(part)
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, me):
            return f"{part} is a link of another user ({_user(st.st_uid)}), who may point it elsewhere"
    real = Path(os.path.realpath(path))
    for part in reversed(real.parents):
        st = os.stat(part)
        if st.st_uid not in (0, me):
            return f"{part}, a folder above it, belongs to another user ({_user(st.st_uid)})"
        if st.st_mode & (stat.S_IWOTH | stat.S_IWGRP) and not st.st_mode & stat.S_ISVTX \
                and not (st.st_uid == me and not_private(st, str(part)) is None):
            return f"{part}, a folder above it, may be written by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return not_private(os.stat(real), str(real))


def _own_group(gid: int) -> bool:
    """Is ``gid`` a group of this user alone (a user private group: named as the user,
    no other members)? A kernel started with umask 002 makes its folders group-writable
    for such a group, which lets in no one else."""
    try:
        group, user = grp.getgrgid(gid), pwd.getpwuid(os.geteuid())
    except KeyError:
        return False
    return gid == user.pw_gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "unknown"
