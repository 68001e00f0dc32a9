"""What a host router sends back to a client: replies (``Entry``), and failures it makes itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable

from ..protocol import envelope, proc_ops, router_ops
from ..wire import serialize
from ..wire.remote_error import pack_exception


@dataclass
class Entry:
    """One reply to send a client: its header (with the client's port) and body."""

    header: dict
    body: Any  # bytes-like
    buffers: list = field(default_factory=list)
    same: bytes | None = None  # the body, for a plain reply that identical ones may join (SAME)


def failure(port: Hashable, rank: int, error: BaseException, died: bool = False, fold: bool = False) -> Entry:
    """``error`` as ``rank``'s reply: a rank that failed (``died``: its proc is gone), or
    with ``fold``, the reducer that failed folding its value (``router_ops.FOLD_FAILED``)."""
    header = {envelope.PORT: port, envelope.RANK: rank, envelope.OK: False}
    if died:
        header[proc_ops.DIED] = True
    if fold:
        header[router_ops.FOLD_FAILED] = True
    body, _ = serialize.dumps(pack_exception(error))
    return Entry(header, body)
