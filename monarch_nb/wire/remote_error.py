"""How an exception raised in a proc travels to the client.

The exception is pickled on its own, so that when its type can't be pickled or
can't be imported on the client, the client still gets a :class:`RemoteException`
with the type name, message and remote traceback instead of a decoding error.
"""

from __future__ import annotations

import traceback as tb_module

import cloudpickle

from ..errors import RemoteException


def pack_exception(exc: BaseException, skip_frames: int = 0) -> tuple:
    """``(type_name, message, traceback_text, pickled_exception_or_None)`` for ``exc``.

    ``skip_frames`` drops that many outermost frames (the runtime's own) from the text.
    """
    tb = exc.__traceback__
    for _ in range(skip_frames):
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    text = "".join(tb_module.format_exception(type(exc), exc, tb))
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        pickled = cloudpickle.dumps(exc.with_traceback(None))
    except Exception:
        pickled = None
    return (name, str(exc), text, pickled)


def unpack_exception(packed: tuple) -> tuple[BaseException, str]:
    """The exception object (original type where possible) and traceback text."""
    name, message, text, pickled = packed
    if pickled is not None:
        try:
            return cloudpickle.loads(pickled), text
        except Exception:
            pass
    return RemoteException(name, message), text
