"""The ops a process's RDMA server answers (``monarch_nb.rdma``, TCP backend), and their
header keys."""

from __future__ import annotations

# Ops (header key ``envelope.OP``); each answered with OK, or an error.
READ = "rdma_read"  # reply: the buffer's bytes
WRITE = "rdma_write"  # body: the bytes to write at the buffer's start

TOKEN = "token"  # which registered buffer (its random token)
