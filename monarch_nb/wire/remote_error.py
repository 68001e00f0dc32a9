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
    Never raises: an exception whose ``__str__`` or ``__reduce__`` raises is described
    by what can be read of it.
    """
    tb = exc.__traceback__
    for _ in range(skip_frames):
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        message = str(exc)
    except BaseException as e:  # noqa: BLE001 - user code: its failure is part of the report
        message = f"<str() of the exception raised {type(e).__name__}>"
    try:
        text = "".join(tb_module.format_exception(type(exc), exc, tb))
    except BaseException:  # noqa: BLE001
        text = "".join(tb_module.format_list(tb_module.extract_tb(tb))) + f"{name}: {message}\n"
    try:
        pickled = cloudpickle.dumps(exc.with_traceback(None))
    except BaseException:  # noqa: BLE001 - sent as its type name and message instead
        pickled = None
    return (name, message, text, pickled)


def unpack_exception(packed: tuple) -> tuple[BaseException, str]:
    """The exception object (original type where possible) and traceback text."""
    name, message, text, pickled = packed
    if pickled is not None:
        try:
            return cloudpickle.loads(pickled), text
        except BaseException:  # noqa: BLE001 - e.g. a __setstate__ raising SystemExit
            pass
    return RemoteException(name, message), text
