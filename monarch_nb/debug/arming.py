"""Starting debugpy inside a proc: once, without restarting the proc, reachable by no
other process.

pydevd runs *in process* (no adapter subprocess) and speaks DAP over one end of a
socketpair whose other end is the proc's own session (``session.ProcDebugger``,
through ``pydevd_adapter.connect_private``): no port, so no local user can connect to
it. IDEs share that session through ``mux``. Every call into debugpy or pydevd goes
through ``pydevd_adapter``; what is here needs neither.
"""

from __future__ import annotations

import linecache
import os
import secrets
import sys
from pathlib import Path
from typing import Callable

from ..private_paths import not_private
from ..proc import cell_files

RUNTIME_DIR = str(Path(__file__).resolve().parent.parent)  # monarch_nb/: never shown or stepped into


def materialize(path: str, source: str) -> None:
    """Write a notebook cell's ``source`` at its file name ``path`` (e.g.
    ``/tmp/ipykernel_123/4567.py``) unless a file is there: debugpy sets breakpoints
    only in files that exist, and tracebacks and ``where`` then show its lines. The
    name is a hash of the text, so a file already there holds the same cell.

    The folder is in a place every user can write (``/tmp``) under a name anyone can
    guess (the kernel's pid is in ``ps``, the hash is of public text): another user can
    make it first and plant a symlink at the name written, and a proc that followed it
    would overwrite a file of its owner's (or plant a cell file showing other lines). So
    a file is used or written only in a folder that is ours and that no one else can
    write (made 0700 if missing), through a temporary file created with ``O_EXCL |
    O_NOFOLLOW`` under a random name, relative to the folder's descriptor; otherwise
    nothing is written and stderr (the proc's log) says why and how to fix it (the
    cell's breakpoints then bind nowhere in this proc). What this writes (the file, and
    the folder when this made it) goes with the cluster: ``proc.cell_files``."""
    if path.startswith("<"):
        return
    folder, name = os.path.split(path)
    try:
        made = _make_folder(folder)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        print(f"monarch_nb: can't write {path} for its breakpoints: {e}", file=sys.stderr, flush=True)
        return
    try:
        here = os.fstat(fd)
        problem = not_private(here, folder)
        if problem is not None:
            print(f"monarch_nb: not writing {path} for its breakpoints: {problem}; its breakpoints don't bind "
                  f"in this proc (remove {folder}, or run the kernel with TMPDIR set to a folder of your own)",
                  file=sys.stderr, flush=True)
            return
        if made:  # ours to remove with the cluster once empty (never the kernel's own folder)
            cell_files.record(folder, here)
        if _exists(name, fd):
            return
        tmp = f"{name}.{secrets.token_hex(8)}.tmp"
        try:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
            with os.fdopen(out, "w") as f:
                f.write(source)
                f.flush()
                written = os.fstat(f.fileno())
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            cell_files.record(folder, written, name)  # removed with the cluster (``proc.cell_files``)
        except OSError as e:
            print(f"monarch_nb: can't write {path} for its breakpoints: {e}", file=sys.stderr, flush=True)
            try:
                os.unlink(tmp, dir_fd=fd)
            except OSError:
                pass
    finally:
        os.close(fd)
    linecache.checkcache(path)


def _make_folder(folder: str) -> bool:
    """Make ``folder`` (0700) unless it is there; True if this call made it. Raises
    ``OSError``."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        return False
    except FileNotFoundError:  # its parent is missing too (a TMPDIR not made yet)
        os.makedirs(os.path.dirname(folder), mode=0o700, exist_ok=True)
        return _make_folder(folder)
    return True


def _exists(name: str, folder_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=folder_fd)
    except OSError:
        return False
    return True


def install_hook(hook: Callable) -> None:
    """Make ``breakpoint()`` call ``hook``. pydevd installs its own hook when imported
    (one that does nothing useful without its client), so this runs again after
    arming."""
    sys.breakpointhook = hook
