"""Same-host shared memory for large frames, and large frames held once on arrival.

A frame set sent to a peer on this host (a loopback address) moves each frame of
``MIN_BYTES`` or more into its own POSIX shared-memory segment instead of pushing it
through the socket: the sender writes the segment once (``write()``, never mapped), and
the receiver either maps it, so a numpy array, tensor or memoryview argument arrives
without a copy on the receiving side, or, for a ``bytes`` or ``bytearray`` value (which
must own its memory), reads it into a new object of that type while truncating the
segment behind the read (``wire.fill``), so the value is held once, not twice. To any
peer, a frame of ``stream.MIN_BYTES`` or more that stays on the socket is sent ahead of
its frame set in chunks (``wire.stream``), which the receiver copies into the new object
one by one as they arrive. What travels on the socket is the frame set with those frames
emptied, after one leading descriptor frame saying, for each, where it is (a segment, or
the stream that carried it) and what to make of it (``b`` bytes, ``a`` bytearray, ``m``
mapped).

Integrity. What travels on the socket is signed (``wire.frames``) and checked before
anything is unpickled; a segment's contents are protected by who can write it: only
this user can create, open or write a segment (mode 0600, created exclusively; the
receiver refuses one owned by anyone else or readable by others), the sender wrote it
through a file it closed before the descriptor left (it never maps it), and the
receiver unlinks it before reading or mapping it, so nobody can open it afterwards. A
process that could still write it runs as this user, and could as well read the
cluster's key. So a frame set whose segments were made for one send (``offload``'s
``segments``: a call's arguments, a return value) is signed with each segment's name
and size in place of its contents, and neither side hashes what it moves through
memory (marked ``seg``). A frame set signed before the send knew the route (``shm``)
covers each frame's contents, as on the socket, and the receiver checks them after
reading. A streamed frame is the receiver's private copy, hashed as it was copied, of
bytes the signature covers, so what was verified is what gets unpickled.

The descriptor frame itself is not signed: a forged one naming segments or streams of
its own, or resizing them, makes other bytes (or other names), which fail the
signature check (every frame's length is signed too); ``seg`` and ``shm`` swapped make
the receiver check another signature than the sender made; one naming a real segment
would have to guess its 64 random bits (it could then only make the real message be
dropped); and a forged ``b``/``a``/``m`` only changes which container holds the
verified bytes (a value of another type is converted on unpickling,
``wire.serialize``). Sizes are checked against what arrived before anything is
allocated.

One frame to many receivers of this host (a router delivering a call to its host's
actors, :func:`sharing`) is written once: the first receiver's segment is made as usual,
and each other receiver gets a hard link to it under a name of its own (a template name,
unlinked when the sends are done, keeps the file linkable while the first receivers
take theirs). The descriptor marks such a segment linked (``lshm``, ``lseg``): its
receiver still unlinks its own name first, but reads it without truncating it (other
receivers read the same file) and maps it private (copy-on-write: a receiver that
writes into its array changes its own copy only, as messages are values).

Names are ``mnb-<cluster tag>-<sender pid>-<receiver's port>-<random>`` in ``/dev/shm``
(the tag: a hash of the cluster id, so that no cluster's names are a prefix of another's),
so that every segment is found and unlinked on every path:

- normally, by the receiver when it takes the segment (before reading or mapping it);
- when the receiver is known gone (``Outbox.discard``), by the sender (:func:`unlink_sent`),
  also when that news comes while the segment is being written (each is noted as sent
  before it exists), or after a call was sent (the client checks its targets once more);
- when the sender died before the receiver took the segment, or the receiver died
  without taking it (nothing listens on its port any more: a kernel restarted while a
  proc sent it a large result), by the host agent's sweep (:func:`sweep_dead`);
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

from . import fill, stream

SHM_DIR = "/dev/shm"
MARKER = b"MNBSHM1 "
# Frames this large go through shared memory (bytes). Signed by name (a call's arguments,
# a return value), a segment is never hashed, where the socket's frames are, on both
# sides: on the 2-core VM here (bench/bench_dataplane.py, figure 4, three runs) shm took
# 0.55-0.65x TCP's time at 256 KiB, 0.64-0.85x at 1 MiB, 0.50-0.59x at 16 MiB and
# 0.36-0.37x at 64 MiB. Below 1 MiB a segment's file (made, opened, unlinked for every
# message) is a larger share for a few hundred microseconds gained.
MIN_BYTES = 1 << 20
# A dead sender's segment is swept only this long after it was written (seconds): a
# message from a sender that exited at once (a reply, then the actor stopped) may still
# be on its way.
SWEEP_AFTER_S = 10.0

_WRITE_CHUNK = 1 << 30  # Linux writes at most ~2 GiB per call
_NAME = re.compile(r"mnb-[0-9a-f]{16}-[0-9]+-[0-9]+-[0-9a-f]{16}\Z")
_warned = False
_sent: dict[str, collections.deque] = collections.defaultdict(collections.deque)  # address -> names
_writing: set[str] = set()  # names noted as sent whose segment is still being written
_sent_lock = threading.Lock()
# This thread's sharing() context: frame id -> (the frame, kept alive so its id is not
# reused, and the template segment's path), or None outside one.
_sharing = threading.local()


class SegmentError(Exception):
    """A descriptor names a segment that is gone, foreign or of the wrong size."""


def is_local(address: str) -> bool:
    """Whether ``address`` (``tcp://HOST:PORT``) is a process of this host: a loopback
    address, or an address of one of this network namespace's own interfaces (the procs
    of a node bind on its routable address when the cluster spans hosts, as with Slurm).
    A peer of another network namespace has an address of its own, not ours."""
    host = address.rpartition("//")[2].rpartition(":")[0]
    if host.startswith("127.") or host in ("localhost", "[::1]"):
        return True
    known = _local_hosts.get(host)
    if known is None:
        known = _local_hosts[host] = host.strip("[]") in _own_interface_addresses()
    return known


_local_hosts: dict[str, bool] = {}  # host -> is_local; peers' addresses do not change meaning


def _own_interface_addresses() -> set[str]:
    try:
        return {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    except OSError:
        return set()


def _prefix(cluster_id: str) -> str:
    return f"mnb-{hashlib.sha256(cluster_id.encode()).hexdigest()[:16]}-"


def _warn_once(error: OSError) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"monarch_nb: shared memory in {SHM_DIR} is unavailable ({error}); large "
                      "buffers to procs of this host go through the socket instead", RuntimeWarning,
                      stacklevel=4)


def _put(cluster_id: str, frame, name: str | None = None) -> str | None:
    """A new segment holding ``frame`` (named ``name``, or a new name for no receiver in
    particular); its name, or ``None`` (after a warning) if none can be made."""
    view = memoryview(frame).cast("B")
    name = name or _new_name(cluster_id, 0)
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


def _new_name(cluster_id: str, port: int) -> str:
    return f"{_prefix(cluster_id)}{os.getpid()}-{port}-{secrets.token_hex(8)}"


def _drop_taken(sent: collections.deque) -> None:
    """Forget the oldest names of ``sent`` whose segments the receiver took (unlinked).
    The caller holds ``_sent_lock``."""
    while sent and sent[0] not in _writing and not os.path.exists(os.path.join(SHM_DIR, sent[0])):
        sent.popleft()


class sharing:
    """A context (``with shm.sharing():``) in which the same frame object sent to several
    receivers on this host is written to shared memory once, then hard-linked for each
    other receiver (see the module docstring). For one thread's sends; the frames must
    not change inside it (they are sent as they were at their first send)."""

    def __enter__(self) -> "sharing":
        self._outer = getattr(_sharing, "frames", None)
        _sharing.frames = {}
        return self

    def __exit__(self, *exc_info) -> None:
        templates, _sharing.frames = _sharing.frames, self._outer
        for _, path in templates.values():
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _put_shared(cluster_id: str, frame, name: str) -> str | None:
    """Inside :func:`sharing`: segment ``name`` holding ``frame``, a new link to the
    file it was first written to, or written now (then linked to a template for the
    next receivers). ``None`` (after a warning) if it can't be made."""
    shared = _sharing.frames
    known = shared.get(id(frame))
    if known is not None:
        try:
            os.link(known[1], os.path.join(SHM_DIR, name))
            return name
        except OSError:  # e.g. the file system refuses links: written again
            pass
    made = _put(cluster_id, frame, name)
    if made is not None and known is None:
        template = os.path.join(SHM_DIR, _new_name(cluster_id, 0))
        try:
            os.link(os.path.join(SHM_DIR, made), template)
            shared[id(frame)] = (frame, template)
        except OSError:
            pass
    return made


def _put_for(address: str, cluster_id: str, frame) -> str | None:
    """:func:`_put` of a segment for the receiver at ``address``, noted as sent to it
    (:func:`unlink_sent`) before it exists: a receiver found gone while the segment is
    written (``Outbox.discard`` runs in another thread) still gets it unlinked. Inside
    :func:`sharing`, a link to the file a previous receiver got."""
    name = _new_name(cluster_id, int(address.rpartition(":")[2]))
    with _sent_lock:  # the loop in a function of its own: see monarch_nb.wire.interrupts
        sent = _sent[address]
        _drop_taken(sent)
        sent.append(name)
        _writing.add(name)
    try:
        if getattr(_sharing, "frames", None) is not None:
            made = _put_shared(cluster_id, frame, name)
        else:
            made = _put(cluster_id, frame, name)
    finally:
        with _sent_lock:
            _writing.discard(name)
            gone = _sent.get(address) is not sent  # unlink_sent ran before the file existed
    if made is not None and gone:
        _unlink(name)
    return made


def kind_of(frame) -> str:
    """How the receiver should hold ``frame``: ``"b"`` (a new ``bytes``), ``"a"`` (a new
    ``bytearray``), or ``"m"`` (as it comes: mapped, or the socket's frame). The first
    two are the out-of-band buffers of ``bytes`` and ``bytearray`` values
    (``wire.serialize``), whose memory the receiving object must own anyway."""
    base = frame if isinstance(frame, (bytes, bytearray)) else memoryview(frame).obj
    return "b" if type(base) is bytes else "a" if type(base) is bytearray else "m"


def offload(address: str, cluster_id: str, frames: list, first: int, segments: dict | None = None,
            streams: list | None = None) -> list:
    """``frames`` as they go to ``address``: ``[descriptor, *frames]`` when some frame
    from ``first`` on travels another way, else ``frames`` itself. A frame of
    ``MIN_BYTES`` or more to a peer on this host moves to a segment (emptied in place);
    one of ``stream.MIN_BYTES`` or more that stays on the socket is emptied in place and
    listed in ``streams`` as ``(index, stream id, kind, view)``, for the caller to send
    ahead of the frame set (``wire.stream``). Nothing is copied here but into segments.

    ``segments``: the caller signs the frame set after this, naming each segment
    instead of hashing its contents (see the module docstring); it gets ``{index:
    segment name}`` for the frames moved to segments, which the descriptor marks so."""
    local = is_local(address)
    linked = "l" if getattr(_sharing, "frames", None) is not None else ""  # its file may have other names
    lines = []
    out = list(frames)
    for i in range(first, len(frames)):
        size = memoryview(frames[i]).nbytes
        if size >= MIN_BYTES and local:
            name = _put_for(address, cluster_id, frames[i])
            if name is not None:
                if segments is not None:
                    segments[i] = name
                lines.append(f"{i} {size} {kind_of(frames[i])} {linked}{'seg' if segments is not None else 'shm'} "
                             f"{name}")
                out[i] = b""
                continue
        if size >= stream.MIN_BYTES and streams is not None:
            stream_id, kind = secrets.token_bytes(16), kind_of(frames[i])
            streams.append((i, stream_id, kind, memoryview(frames[i])))
            lines.append(f"{i} {size} {kind} stream {stream_id.hex()}")
            out[i] = b""
    if not lines:
        return frames
    return [MARKER + "\n".join(lines).encode(), *out]


def restore(frames: list, cluster_ids, segments: dict, streams=None, digests: dict | None = None) -> list:
    """Inverse of :func:`offload` on the receiving side: the frame set with each
    emptied frame back, as a new ``bytes`` or ``bytearray`` read out of its segment or,
    for other frames, its segment mapped (writable, private to this process once
    unlinked), or as the value its stream assembled (``streams``: the receiving inbox's
    ``stream.Streams``). Fills ``segments`` with ``{index: name}`` of the segments the
    frame set is signed by name (``offload``'s ``segments``), and ``digests`` with
    ``{index: (keys, digest)}`` of the streamed frames. Raises :class:`SegmentError` for
    a malformed descriptor, a segment that is missing, not of ``cluster_ids``, not this
    user's own, or of the wrong size, or a stream that is missing or incomplete; every
    segment the descriptor names is unlinked either way."""
    entries: list[tuple[int, int, type, str, str]] = []  # index, size, kind, how, segment name or stream id
    try:
        for line in bytes(frames[0])[len(MARKER):].decode().split("\n"):
            at, nbytes, letter, how, what = line.split(" ")
            if letter not in _KINDS or how not in ("shm", "seg", "lshm", "lseg", "stream"):
                raise ValueError(line)
            entries.append((int(at), int(nbytes), _KINDS[letter], how, what))
            if how in ("seg", "lseg"):
                segments[int(at)] = what
    except ValueError:  # UnicodeDecodeError too
        raise SegmentError("malformed shared-memory descriptor") from None
    out = frames[1:]
    prefixes = tuple(_prefix(c) for c in cluster_ids)
    error = None
    for index, size, kind, how, what in entries:
        try:
            if not 0 <= index < len(out):
                raise IndexError(f"no frame {index}")
            if how == "stream":
                if streams is None or digests is None:
                    raise SegmentError("a streamed frame where none can arrive")
                out[index], keys, digest = streams.take(bytes.fromhex(what), size)
                digests[index] = (keys, digest)
            elif not (_NAME.match(what) and what.startswith(prefixes)):
                error = error or SegmentError(f"segment {what!r} is not one of this process's clusters")
            else:
                out[index] = _take(what, size, kind, linked=how.startswith("l"))
        except (OSError, EOFError, ValueError, SegmentError, IndexError, stream.StreamError) as e:
            error = error or SegmentError(f"frame {index}: {e}")
    if error is not None:
        raise error
    return out


_KINDS = {"b": bytes, "a": bytearray, "m": memoryview}


def _take(name: str, size: int, kind: type, linked: bool = False):
    """Segment ``name``, unlinked, as a new ``kind`` or (``memoryview``) mapped;
    ``linked``: other receivers read the same file (kept whole, mapped private)."""
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        os.unlink(path)
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077 or st.st_size != size:
            raise SegmentError("not this user's own segment of the announced size")
        if kind is not memoryview:
            # Read, not mapped: the value must own its memory, and the segment's pages
            # are freed as the read goes (wire.fill), so the value is held once.
            return fill.from_fd(fd, size, kind, release=not linked)
        if linked:  # private: not populated, which would copy every page (a write fault each)
            return memoryview(mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE))
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


def _listening_ports() -> set[int] | None:
    """The TCP ports something listens on in this network namespace (from
    ``/proc/net/tcp`` and ``tcp6``); ``None`` where neither can be read."""
    ports, read = set(), False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        read = True
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":  # TCP_LISTEN
                ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports if read else None


def sweep_dead(cluster_id: str) -> int:
    """Unlink segments of ``cluster_id`` that nobody took within ``SWEEP_AFTER_S`` and
    never will: their sender is dead, or nothing listens on their receiver's port any
    more (inboxes are bound sockets of this host); returns how many."""
    swept = 0
    now = time.time()
    listening: set[int] | None = None
    for name in _segments(cluster_id):
        _, _, pid, port, _ = name.split("-")
        if psutil.pid_exists(int(pid)):
            if port == "0":  # no receiver in particular
                continue
            if listening is None:
                listening = _listening_ports() or set()
            if not listening or int(port) in listening:  # (unreadable: every receiver may live)
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
