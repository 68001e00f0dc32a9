"""The ops a process's RDMA server answers (``monarch_nb.rdma``, TCP backend), and their
header keys."""

from __future__ import annotations

# Ops (header key ``envelope.OP``); each answered with OK, or an error.
READ = "rdma_read"  # reply: the bytes of the buffer's range
WRITE = "rdma_write"  # body: the bytes to write at the range's start

TOKEN = "token"  # which registered buffer (its random token)
OFFSET = "offset"  # where the range starts in the buffer (bytes; absent: 0)
LENGTH = "length"  # how long it is (bytes; absent: to the buffer's end)

# In an error reply: the buffer is not registered (any more): its owner dropped it, or the
# actor that made it ended. The reader names which buffer, and its owner.
DROPPED = "dropped"
