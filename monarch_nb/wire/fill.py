"""Receiving a large frame straight into the type the sender had, one copy, no more.

A ``bytes`` or ``bytearray`` argument (or return value) owns its memory, so the
receiver must copy it out of whatever the transport handed over: a shared-memory
segment or the socket's chunks (``wire.stream``). Done naively (``bytes(frame)``) that
holds the source and the copy at once: 2 GiB for a 1 GiB value. Here the copy is made
piece by piece and each piece of the source is released once copied (a segment is
truncated behind the read, a chunk is dropped), so the receiver holds the value plus
one piece.

``bytes`` are filled in place: :func:`fresh_bytes` allocates one with
``bytes(n)`` (calloc: its pages cost nothing until written) and hands out a writable
view of its storage, which is what C code does with ``PyBytes_FromStringAndSize(NULL,
n)``. Nothing else can see the object until it is filled, and its hash is not yet
computed, so the object is indistinguishable from one built by copying. The storage's
offset is checked once against a known bytes object; where it does not hold (another
interpreter), :func:`fresh_bytes` returns ``None`` and callers copy the plain way.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any

# How much of a source is copied before that part of it is released (bytes).
PIECE_BYTES = 64 << 20
_MAX_READ = 1 << 30  # Linux reads at most ~2 GiB per call


def _storage_offset() -> int | None:
    """Where a bytes object's bytes start, from ``id(obj)``; ``None`` if unknown."""
    offset = bytes.__basicsize__ - 1  # PyBytesObject: header, hash, then ob_sval[1]
    probe = b"monarch_nb: where do a bytes object's contents start?"
    try:
        if ctypes.string_at(id(probe) + offset, len(probe)) == probe:
            return offset
    except Exception:  # noqa: BLE001 - any failure means: don't fill in place
        pass
    return None


_OFFSET = _storage_offset()


def fresh_bytes(nbytes: int) -> tuple[bytes, memoryview] | None:
    """A new zero-filled ``bytes`` of ``nbytes`` (> 1) and a writable byte view of its
    storage, for the caller to fill before anything else sees the object; ``None`` where
    this interpreter's layout is unknown. Keep the bytes object alive while using the view."""
    if _OFFSET is None or nbytes < 2:  # bytes of 0 and 1 byte are shared singletons
        return None
    value = bytes(nbytes)
    address = id(value) + _OFFSET
    _huge_pages(address, nbytes)
    view = memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")
    return value, view


_HUGE = 2 << 20
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)
_madvise: Any
try:
    _madvise = ctypes.CDLL(None, use_errno=True).madvise
    _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
except (OSError, AttributeError):
    _madvise = None


def _huge_pages(address: int, nbytes: int) -> None:
    """Ask for transparent huge pages over the untouched memory at ``address``
    (best effort). Where THP is "madvise" only, as on the VMs here, filling 64 MiB of
    fresh 4 KiB pages took 140-230 ms (a fault per page) and 23-40 ms with huge pages;
    numpy asks the same for its large arrays."""
    if _madvise is None or _MADV_HUGEPAGE is None or nbytes < 2 * _HUGE:
        return
    start = (address + _HUGE - 1) & ~(_HUGE - 1)
    end = (address + nbytes) & ~(_HUGE - 1)
    if end > start:
        _madvise(start, end - start, _MADV_HUGEPAGE)


_MADV_POPULATE_WRITE = 23  # Linux 5.14 and later (<linux/mman.h>)
_page = mmap.PAGESIZE


def prefault(view: memoryview, start: int, nbytes: int) -> None:
    """Fault in the pages of the writable ``view`` from byte ``start`` on, ``nbytes`` of
    them, in one system call (``MADV_POPULATE_WRITE``), ahead of writing them: a fault
    per page, taken as the writes come, cost the VMs here ~70% more. Best effort: pages
    that are not whole within the range, or a kernel without it, fault as usual."""
    if _madvise is None or nbytes < _page:
        return
    anchor = ctypes.c_char.from_buffer(view)
    address = ctypes.addressof(anchor) + start
    del anchor  # (it holds an export of the view's buffer)
    prefault_at(address, nbytes)


def prefault_at(address: int, nbytes: int) -> None:
    """:func:`prefault` of the writable memory at ``address``, ``nbytes`` long (already
    populated pages cost only the walk over them)."""
    first = (address + _page - 1) & ~(_page - 1)
    end = (address + nbytes) & ~(_page - 1)
    if _madvise is not None and end > first:
        _madvise(first, end - first, _MADV_POPULATE_WRITE)


def from_fd(fd: int, nbytes: int, kind: type, release: bool = True) -> bytes | bytearray:
    """The ``nbytes`` bytes of the regular file ``fd`` (an unlinked shared-memory segment
    of exactly that size) as a new ``kind`` (``bytes`` or ``bytearray``), read from the
    end backwards and (``release``) the file truncated behind each piece, so the file's
    pages are freed as the value's are filled; ``release=False`` for a file other
    readers share. Raises ``OSError`` (the file is left truncated somewhere),
    ``EOFError`` when it is shorter than ``nbytes``."""
    fresh = fresh_bytes(nbytes) if kind is bytes else None
    if fresh is None and kind is bytes:  # unknown layout: one read makes the bytes
        return _read_all(fd, nbytes)
    value, view = fresh if fresh is not None else (bytearray(nbytes), None)
    if view is None:
        view = memoryview(value)
    end = nbytes
    while end > 0:
        start = max(0, end - PIECE_BYTES)
        got = start
        while got < end:
            n = os.preadv(fd, [view[got:end]], got)
            if n == 0:
                raise EOFError(f"shared-memory segment ended before byte {got} of {nbytes}")
            got += n
        if release:
            os.ftruncate(fd, start)
        end = start
    view.release()
    return value


def _read_all(fd: int, nbytes: int) -> bytes:
    if nbytes <= _MAX_READ:
        data = os.pread(fd, nbytes, 0)
    else:
        data = b"".join(os.pread(fd, min(_MAX_READ, nbytes - at), at) for at in range(0, nbytes, _MAX_READ))
    if len(data) != nbytes:
        raise EOFError(f"shared-memory segment holds {len(data)} of {nbytes} bytes")
    return data
