"""Where a cluster's files live and how they are written.

Each cluster has a directory ``$MONARCH_NB_HOME/clusters/NAME/`` (default home
``~/.local/share/monarch_nb``), mode 0700, holding ``cluster.json`` (addresses and
the signing key, mode 0600). Files are written atomically (a temporary file under a
random name, created exclusively, then renamed). The home must be this user's alone
(``private_paths``): one that another local user made first, or may write in, is
refused before anything is written there or read from it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
from pathlib import Path

from .private_paths import unsafe_folder


def home() -> Path:
    """``MONARCH_NB_HOME`` or ``~/.local/share/monarch_nb``."""
    env = os.environ.get("MONARCH_NB_HOME")
    return Path(env) if env else Path.home() / ".local" / "share" / "monarch_nb"


def clusters_root() -> Path:
    return home() / "clusters"


def bad_home(error: OSError) -> ValueError:
    """The error to raise for ``error``, met making or reading a folder or file of the
    home: it names ``MONARCH_NB_HOME``, the path and the fix."""
    env = os.environ.get("MONARCH_NB_HOME")
    where = f"MONARCH_NB_HOME={env}" if env else f"monarch_nb's home {home()}"
    return ValueError(f"{where} can't hold monarch_nb's files ({error.strerror}: {error.filename}); set "
                      "MONARCH_NB_HOME to a directory you can write, or one that can be made")


def check_home() -> None:
    """Raise ``ValueError`` (as for any home that can't serve) naming the home, what is
    wrong and the fix when another local user could change it or a folder above it
    (``private_paths``); nothing when it does not exist yet (it is made 0700)."""
    folder = home()
    try:
        problem = unsafe_folder(folder)
    except FileNotFoundError:
        return
    except OSError as e:
        raise bad_home(e) from None
    if problem is not None:
        env = os.environ.get("MONARCH_NB_HOME")
        where = f"MONARCH_NB_HOME={env}" if env else f"monarch_nb's home {folder}"
        raise ValueError(f"{where} is not yours alone: {problem}. Another local user could take this cluster's "
                              "key from it and run code as you. Use a folder only you can write (e.g. mkdir -m 700 "
                              "~/monarch_nb_home and set MONARCH_NB_HOME to it), or unset MONARCH_NB_HOME")


def make_folder(path: Path) -> None:
    """``mkdir -p path`` (mode 0700) under the home; raises :func:`bad_home`'s error when
    the home's path can't be a folder (a file in the way, a parent that can't be made
    or written), and :func:`check_home`'s when the home is not this user's alone."""
    check_home()
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except (FileNotFoundError, NotADirectoryError, FileExistsError, PermissionError) as e:
        raise bad_home(e) from None
    check_home()  # (made now, as a parent: the same rules)


def kept_logs_path(name: str) -> Path:
    """Where the log store of the stopped cluster ``name`` is kept
    (``$MONARCH_NB_HOME/stopped/NAME.sqlite``; see ``hub.logstore.keep``)."""
    cluster_path(name)  # validates the name
    return home() / "stopped" / f"{name}.sqlite"


# In cluster.json while a recovering hub is not ready yet: the address its predecessor
# had, which it takes again (and so would the next recover, should this one die first).
LAST_HUB = "last_hub"
MAX_NAME_CHARS = 64
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,%d}" % (MAX_NAME_CHARS - 1))
NAME_RULE = f"use 1-{MAX_NAME_CHARS} letters, digits, '_', '.' or '-', starting with a letter or digit"


def is_valid_name(name) -> bool:
    """True for a name usable for a cluster or a mesh (also a file name, and a proc id
    prefix ``NAME/RANK``)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def cluster_path(name: str) -> Path:
    """The directory of cluster ``name``. Raises ``ValueError`` for a name that is not
    1-64 letters, digits, ``_``, ``.`` or ``-`` starting with a letter or digit."""
    if not isinstance(name, str):
        raise TypeError(f"a cluster name is a string, not {type(name).__name__}")
    if not is_valid_name(name):
        raise ValueError(f"bad cluster name {name!r}: {NAME_RULE} (e.g. 'default', 'exp-1')")
    return clusters_root() / name


@contextlib.contextmanager
def locked(name: str):
    """Hold the lock of cluster ``name`` (a file beside its directory, so that removing
    the directory keeps it): starting, recovering and clearing a cluster take it, so
    two clients doing so at once never make two hubs or delete a starting cluster.
    The holder that finds no directory left as it lets go removes the file (a stopped
    cluster leaves nothing in the clusters folder)."""
    root = clusters_root()
    make_folder(root)
    lock = root / f".{cluster_path(name).name}.lock"  # cluster_path validates the name
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        # The holder we waited for removed the file: our lock is on a file nobody else
        # will open again. Take the lock of the file that is there now.
        os.close(fd)
    try:
        yield
    finally:
        try:
            if not (root / name).exists():
                os.unlink(lock)  # while held: a waiter sees the file gone and opens a new one
        finally:
            os.close(fd)


def forget_lock(name: str) -> None:
    """Remove the lock file of cluster ``name`` if its directory is gone (after a
    stop); waits for a holder of the lock first. Never call while holding it."""
    with locked(name):
        pass


def create(name: str) -> tuple[Path, dict]:
    """Make the directory of a new cluster and its ``cluster.json`` with a fresh key.

    Returns ``(directory, info)``; raises ``FileExistsError`` if it exists."""
    path = cluster_path(name)
    make_folder(path.parent)
    path.mkdir(mode=0o700)
    os.chmod(path, 0o700)
    info = {"name": name, "cluster_id": secrets.token_hex(8), "key": secrets.token_hex(32)}
    write_json(path / "cluster.json", info)
    return path, info


def read_info(path: Path) -> dict:
    """The ``cluster.json`` of the cluster directory ``path``; raises
    :func:`check_home`'s error when the home is not this user's alone (its key and hub
    address may be another user's)."""
    check_home()
    with open(path / "cluster.json") as f:
        return json.load(f)


def key_of(info: dict) -> bytes:
    return bytes.fromhex(info["key"])


def write_json(target: Path, data: dict) -> None:
    """Atomically replace ``target`` with ``data`` as JSON, mode 0600 (through a new file
    under a random name: never one that is there already, nor a link)."""
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # (a full disk: none left behind under its random name)
        raise
