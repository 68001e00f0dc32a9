"""The chain of actors waiting on a call: how a call that would wait on itself is caught.

An actor runs one call at a time (a ``@concurrent_endpoint`` aside): while its endpoint
waits on another call it serves nothing else. A call that reaches, directly or around a
cycle (A → B → A), an actor that is waiting on it can therefore never be answered, and
Monarch hangs there for good. Here every call carries, in its header
(``proc_ops.CHAIN``), the actors held up along the calls that led to it: the chain of
the call its sender is handling, plus the sender itself unless its endpoint is
concurrent. A wait (``get()``, ``await``) on a call to an actor of that chain raises
:class:`~monarch_nb.errors.CallCycleError` at once instead of hanging; the actors stay
usable.

An entry is ``(address, label)``: the actor's inbox and ``MESH[RANK]`` for messages.
The chain of the call a thread handles is kept per thread (set by the actor loops
around each step of user code, like the call's origin).
"""

from __future__ import annotations

import threading

Chain = tuple  # of (address, label) pairs, outermost caller first

_calls = threading.local()


def set_chain(chain: Chain | None) -> None:
    """Called by the actor loops around user code: calls made now carry ``chain``."""
    _calls.chain = chain


def current() -> Chain:
    """The chain to put on a call made now (empty outside actors)."""
    return getattr(_calls, "chain", None) or ()


def extend(incoming, address: str | None, label: str, holds: bool) -> Chain:
    """The chain of a call being handled: the ``incoming`` header value, plus this actor
    when its endpoint ``holds`` it (the actor serves nothing else until it returns)."""
    chain = tuple(tuple(entry) for entry in incoming or ())
    return chain + ((address, label),) if holds and address is not None else chain


def cycle(chain: Chain, targets) -> list[str] | None:
    """The labels of the cycle a wait on a call to ``targets`` (inbox addresses) would
    close, from the first held-up target to this actor; ``None`` when there is none."""
    for i, (address, _label) in enumerate(chain):
        if address in targets:
            return [label for _address, label in chain[i:]]
    return None
