"""Notebook cell files that procs write for the debugger, and their removal with the
cluster.

A proc writes a cell's text at the file name the kernel gave it (ipykernel:
``/tmp/ipykernel_PID/HASH.py``) so that debugpy can set breakpoints in it and
tracebacks show its lines (``debug.arming.materialize``). Those files must not outlive
the cluster. Procs end by SIGTERM or SIGKILL from their host agent, so they can't
remove them; the host agent outlives its procs on every host, so it does: each proc
appends what it created to its host's *record* (a file the agent names in
``MONARCH_NB_CELL_FILES``, in the cluster's private directory), and the agent, once its
procs are gone, removes each recorded file (and folder) that is still the very one a
proc created (same device, inode, size and modification time: an inode is soon reused),
in a folder that is still ours alone. What
monarch_nb did not create (a cell file already there, the kernel's own
``/tmp/ipykernel_PID`` folder, a file put in its place since) is never removed.

Record: one JSON object a line, appended with ``O_APPEND`` (one ``write`` each, so
procs writing at once don't interleave): ``{"folder", "id", "name"}`` for a file
(``name``) or for a folder a proc made (no ``name``); ``id`` is what tells it from
another under that name (``_identity``).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

from ..private_paths import not_private

RECORD_ENV = "MONARCH_NB_CELL_FILES"  # the record a proc appends to (set by its host agent)


def record_path(cluster_dir: str, host_id: str) -> Path:
    """The record of the cell files written by the procs of host ``host_id``: in the
    cluster's directory (mode 0700), one per host, as that directory may be shared."""
    return Path(cluster_dir) / "cell_files" / f"{host_id}.jsonl"


def prepare(path: Path) -> None:
    """Make the folder of the record ``path`` (0700). Raises ``OSError``."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)


def record(folder: str, st: os.stat_result, name: str | None = None) -> None:
    """Note that this proc created ``name`` in ``folder`` (``st``: its ``fstat``), or
    the folder itself when ``name`` is None, for removal with the cluster. Nothing to do
    outside a host agent's proc (no record named); a record that can't be written is
    said on stderr (the file then stays)."""
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    entry = {"folder": folder, "id": _identity(st), **({"name": name} if name is not None else {})}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, (json.dumps(entry) + "\n").encode())
        finally:
            os.close(fd)
    except OSError as e:
        print(f"monarch_nb: can't note {os.path.join(folder, name or '')} for removal with the cluster: {e}",
              file=sys.stderr, flush=True)


def sweep(path: Path) -> int:
    """Remove what the record ``path`` lists (files first, then folders, a folder only
    when empty), then the record itself; returns how many files and folders went.
    Call once no proc of this host runs. Never raises for a file or folder: one that is
    gone, replaced or no longer in a folder of ours alone is left (and said on stderr
    when it is not ours)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return 0
    except OSError as e:
        print(f"monarch_nb: can't read {path} to remove cell files: {e}", file=sys.stderr, flush=True)
        return 0
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
            entries.append((str(entry["folder"]), [int(v) for v in entry["id"]], entry.get("name")))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a proc killed while writing it
    removed = 0
    for folder, identity, name in sorted(entries, key=lambda e: e[2] is None):  # files before folders
        removed += _remove(folder, identity, name)
    try:
        path.unlink()
    except OSError:
        pass
    return removed


def _identity(st: os.stat_result) -> list[int]:
    """What tells a file or folder from another that took its name and, perhaps, its
    inode: a folder's device and inode (its mtime changes as files come and go), a
    file's also its size and modification time (ns)."""
    if stat.S_ISDIR(st.st_mode):
        return [st.st_dev, st.st_ino]
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def _remove(folder: str, identity: list[int], name: str | None) -> int:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return 0  # gone already
    try:
        st = os.fstat(fd)
        problem = not_private(st, folder)
        if problem is not None:
            print(f"monarch_nb: not removing cell files from {folder}: {problem}", file=sys.stderr, flush=True)
            return 0
        if name is None:
            if _identity(st) != identity:
                return 0  # another folder under that name now
            try:
                os.rmdir(folder)  # only when empty: files of others (the kernel's) stay, and it with them
            except OSError:
                return 0
            return 1
        try:
            file = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return 0
        if not stat.S_ISREG(file.st_mode) or _identity(file) != identity:
            return 0  # not the file a proc wrote
        try:
            os.unlink(name, dir_fd=fd)
        except OSError:
            return 0
        return 1
    finally:
        os.close(fd)


