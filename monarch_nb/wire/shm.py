"""Same-host shared memory for large frames.

A frame set sent to a peer on this host (a loopback address) moves each frame of
``MIN_BYTES`` or more into its own POSIX shared-memory segment instead of pushing it
through the socket: the sender writes the segment once, the receiver maps it, so a
numpy array or tensor argument arrives without a copy on the receiving side and without
crossing loopback TCP. What travels on the socket is the frame set with those frames
emptied, after one leading descriptor frame naming the segments.

Integrity holds as on the socket: the frame set's signature covers the frames' contents
as the sender encoded them (``frames``), and the receiver checks it over the mapped
segments before anything is unpickled. Only this user can create, open or write a
segment (mode 0600, created exclusively; the receiver refuses one owned by anyone else
or readable by others), the receiver unlinks it before mapping it, and the sender has
closed its own mapping by then, so what was verified is what gets unpickled. The
descriptor frame itself is not signed: a forged one naming segments of its own fails
the signature check, and one naming a real segment would have to guess its 64 random
bits (it could then only make the real message be dropped).

Names are ``mnb-<cluster tag>-<sender pid>-<random>`` in ``/dev/shm`` (the tag: a hash
of the cluster id, so that no cluster's names are a prefix of another's), so that every
segment is found and unlinked on every path:

- normally, by the receiver when it maps the segment;
- when the receiver is known gone (``Outbox.discard``), by the sender (:func:`unlink_sent`);
- when the sender died before the receiver took the segment, by the host agent's sweep
  of dead pids (:func:`sweep_dead`);
- at cluster stop, by the host agent as it exits (:func:`remove_all`).

When ``/dev/shm`` is missing or full, the frames go through the socket as before,
after one warning per process; a call never fails for it.
"""

from __future__ import annotations

import collections
import hashlib
import mmap
import os
import re
import secrets
import threading
import time
import warnings

import psutil

SHM_DIR = "/dev/shm"
MARKER = b"MNBSHM1 "
# Frames this large go through shared memory (bytes). A fresh segment's pages cost a
# fault each, where libzmq's receive buffers below ~32 MiB are reused heap: on the 2-core
# VM here (bench/bench_dataplane.py, figure 4, three runs) shm took 1.1-2.0x TCP's time at
# 1 MiB, 1.5-4.3x at 16 MiB and 0.94-1.16x at 64 MiB: it only breaks even at 64 MiB.
MIN_BYTES = 64 << 20
# A dead sender's segment is swept only this long after it was written (seconds): a
# message from a sender that exited at once (a reply, then the actor stopped) may still
# be on its way.
SWEEP_AFTER_S = 10.0

_WRITE_CHUNK = 1 << 30  # Linux writes at most ~2 GiB per call
_NAME = re.compile(r"mnb-[0-9a-f]{16}-[0-9]+-[0-9a-f]{16}\Z")
_warned = False
_sent: dict[str, collections.deque] = collections.defaultdict(collections.deque)  # address -> names
_sent_lock = threading.Lock()


class SegmentError(Exception):
    """A descriptor names a segment that is gone, foreign or of the wrong size."""


def is_local(address: str) -> bool:
    """Whether ``address`` (``tcp://HOST:PORT``) is a loopback address of this host."""
    host = address.rpartition("//")[2].rpartition(":")[0]
    return host.startswith("127.") or host in ("localhost", "[::1]")


def _prefix(cluster_id: str) -> str:
    return f"mnb-{hashlib.sha256(cluster_id.encode()).hexdigest()[:16]}-"


def _warn_once(error: OSError) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"monarch_nb: shared memory in {SHM_DIR} is unavailable ({error}); large "
                      "buffers to procs of this host go through the socket instead", RuntimeWarning,
                      stacklevel=4)


def _put(cluster_id: str, frame) -> str | None:
    """A new segment holding ``frame``; its name, or ``None`` (after a warning) if none can be made."""
    view = memoryview(frame).cast("B")
    name = f"{_prefix(cluster_id)}{os.getpid()}-{secrets.token_hex(8)}"
    path = os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        _warn_once(e)
        return None
    try:
        # write(), not a mapping: a full /dev/shm is then an error here (ENOSPC), not a
        # SIGBUS later, and it is one copy into freshly allocated pages.
        done = 0
        while done < view.nbytes:
            done += os.write(fd, view[done:done + _WRITE_CHUNK])
    except OSError as e:
        os.unlink(path)
        _warn_once(e)
        return None
    finally:
        os.close(fd)
    return name


def offload(address: str, cluster_id: str, frames: list, first: int) -> list:
    """``frames`` for ``address`` with every frame from ``first`` on of ``MIN_BYTES`` or
    more moved to a segment: ``[descriptor, *frames]`` with those frames emptied, or
    ``frames`` itself when there are none (or no segment could be made)."""
    moved = []
    out = list(frames)
    for i in range(first, len(frames)):
        size = memoryview(frames[i]).nbytes
        if size >= MIN_BYTES:
            name = _put(cluster_id, frames[i])
            if name is None:
                break
            moved.append(f"{i} {size} {name}")
            out[i] = b""
    if not moved:
        return frames
    with _sent_lock:
        names = _sent[address]
        while names and not os.path.exists(os.path.join(SHM_DIR, names[0])):
            names.popleft()  # taken by the receiver
        names.extend(m.rpartition(" ")[2] for m in moved)
    return [MARKER + "\n".join(moved).encode(), *out]


def restore(frames: list, cluster_ids) -> list:
    """Inverse of :func:`offload` on the receiving side: the frame set with each
    segment mapped (writable, private to this process once unlinked) in place of its
    emptied frame. Raises :class:`SegmentError` for a segment that is missing, not
    of ``cluster_ids``, not this user's own, or of the wrong size; every segment the
    descriptor names is unlinked either way."""
    try:
        entries = [(int(i), int(n), name) for i, n, name in
                   (line.split(" ") for line in bytes(frames[0])[len(MARKER):].decode().split("\n"))]
    except ValueError:  # UnicodeDecodeError too
        raise SegmentError("malformed shared-memory descriptor") from None
    out = list(frames[1:])
    prefixes = tuple(_prefix(c) for c in cluster_ids)
    error = None
    for index, size, name in entries:
        if not (_NAME.match(name) and name.startswith(prefixes)):
            error = error or SegmentError(f"segment {name!r} is not one of this process's clusters")
            continue
        try:
            out[index] = _map(name, size)
        except (OSError, SegmentError, IndexError) as e:
            error = error or SegmentError(f"segment {name}: {e}")
    if error is not None:
        raise error
    return out


def _map(name: str, size: int) -> memoryview:
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        os.unlink(path)
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077 or st.st_size != size:
            raise SegmentError("not this user's own segment of the announced size")
        # Populated: faulting the pages in at once costs less than one by one on first use.
        return memoryview(mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)))
    finally:
        os.close(fd)


def unlink_sent(address: str) -> None:
    """The receiver at ``address`` is gone: unlink the segments sent to it that it never took."""
    with _sent_lock:
        names = _sent.pop(address, ())
    for name in names:
        _unlink(name)


def _unlink(name: str) -> None:
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        pass


def _segments(cluster_id: str) -> list[str]:
    try:
        return [n for n in os.listdir(SHM_DIR) if n.startswith(_prefix(cluster_id)) and _NAME.match(n)]
    except OSError:
        return []


def sweep_dead(cluster_id: str) -> int:
    """Unlink segments of ``cluster_id`` whose sender is dead and that nobody took
    within ``SWEEP_AFTER_S``; returns how many."""
    swept = 0
    now = time.time()
    for name in _segments(cluster_id):
        pid = int(name.split("-")[2])
        if psutil.pid_exists(pid):
            continue
        try:
            if now - os.stat(os.path.join(SHM_DIR, name)).st_mtime < SWEEP_AFTER_S:
                continue
        except FileNotFoundError:
            continue
        _unlink(name)
        swept += 1
    return swept


def remove_all(cluster_id: str) -> None:
    """Unlink every segment of ``cluster_id`` on this host (the cluster is stopping)."""
    for name in _segments(cluster_id):
        _unlink(name)
