"""The health tree while a cell blocks: the ``monarch`` kernel answers widget messages on
a subshell of its own (ipykernel's kernel subshells, JEP 91), not on the main shell that
a cell's ``fut.get()`` holds.

A frontend that (re)loads a notebook asks the kernel for the widgets' state: it opens a
comm to ``jupyter.widget.control`` and sends ``request_states`` (4 s timeout), falling
back to ``comm_info_request`` and one ``request_state`` per comm. JupyterLab sends these
with no ``subshell_id`` (its per-comm-target subshell is not created yet when the widget
manager opens the control comm), so a stock kernel queues them behind the running cell
and the page shows "Loading widget..." until the cell ends. The ``monarch`` kernel sends
these to its widget subshell instead (a thread with its own event loop):

- ``kernel_info_request`` and ``comm_info_request`` with no ``subshell_id`` (answered
  with busy/idle status, which frontends leave out of the kernel's state for these);
- ``comm_open`` of ``jupyter.widget.control`` with no ``subshell_id``, and that comm's
  messages (``request_states``): every widget's state, the user's too;
- ``comm_msg``/``comm_close`` of the widgets :func:`mark` marks (the health tree: a
  click opens or closes a level while a cell runs).

Comm messages are answered without busy/idle status (as ipykernel does for comms during
an async cell), so the page keeps showing the kernel busy with the cell. Everything else,
the user's widgets' messages included, goes where ipykernel sends it (their callbacks
run in the main thread, after the cell, as users expect).

Handlers on the subshell read ``ipywidgets``' and the comm manager's registries while
other threads (the cell's, the health feed's, the user's) may add to them; a read that
meets "dictionary changed size during iteration" is retried, up to 20 times (it sends
only once it has read everything). A thread that makes widgets every few milliseconds,
faster than a read finishes, could still starve it: the page then waits for the cell.

Needs ipykernel >= 7 with subshells (the kernel checks at start, and routes as ipykernel
does when something it relies on is missing). In a stock kernel with ``%load_ext
monarch_nb`` nothing changes: the tree renders once the cell ends.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a mixin of it; not imported at run time (the health widget imports mark)
    from ipykernel.ipkernel import IPythonKernel as _Kernel
else:
    _Kernel = object

CONTROL_TARGET = "jupyter.widget.control"
_MARK = "_monarch_nb_widget_subshell"  # set on the kernel-side comm object of a marked widget
_COMM_TYPES = frozenset({"comm_open", "comm_msg", "comm_close"})
_RETRIES = 20
_READ_SWITCH_S = 0.5  # the interpreter's switch interval while a read runs (default 0.005)

log = logging.getLogger(__name__)


def mark(*widgets) -> None:
    """Have the ``monarch`` kernel answer these widgets' comm messages (and those of
    their ``layout`` and ``style``) on its widget subshell, even while a cell runs, so
    their callbacks run in that thread: use it only for widgets whose callbacks are
    thread-safe. Widgets without a comm (closed) are skipped; no effect elsewhere."""
    for widget in widgets:
        for part in (widget, getattr(widget, "layout", None), getattr(widget, "style", None)):
            comm = getattr(part, "comm", None)
            if comm is not None:
                setattr(comm, _MARK, True)


def _retried(read):
    """``read`` again while another thread changes a dict it iterates (at most
    ``_RETRIES`` times; a read sends only at its end, so a retry repeats nothing)."""
    @functools.wraps(read)
    def again(*args, **kwargs):
        for attempt in range(_RETRIES):
            try:
                with _few_thread_switches():
                    return read(*args, **kwargs)
            except RuntimeError as e:
                if "changed size during iteration" not in str(e) or attempt == _RETRIES - 1:
                    raise
    return again


@contextlib.contextmanager
def _few_thread_switches():
    """While a read of every widget runs: other threads (one making widgets every few ms)
    get the interpreter only where it blocks, so they rarely change the registry under
    it. Without this, on a loaded machine, 20 reads in a row met a change (CI)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(_READ_SWITCH_S)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


class WidgetSubshellKernel(_Kernel):
    """Mixin for an ipykernel kernel (before ``IPythonKernel`` in the bases): the widget
    subshell described above. ``widget_subshell_id``: its id once open (``None``
    before, and in a kernel that cannot have one)."""

    widget_subshell_id: str | None = None

    def start(self):
        super().start()
        self._control_comms: set[str] = set()  # touched only in the shell channel thread
        if self._can_have_widget_subshell():
            self.shell_channel_thread.io_loop.add_callback(self._open_widget_subshell)
        else:
            log.info("monarch_nb: no widget subshell (needs ipykernel >= 7 with subshells)")

    def _can_have_widget_subshell(self) -> bool:
        thread = getattr(self, "shell_channel_thread", None)
        manager = getattr(thread, "manager", None) if thread is not None else None
        return (manager is not None and hasattr(manager, "_create_subshell")
                and hasattr(manager, "get_shell_channel_to_subshell_socket")
                and hasattr(self, "_shell_parent") and hasattr(self, "_shell_parent_ident")
                and hasattr(self, "comm_manager")
                and "concurrent" in inspect.signature(self.dispatch_shell).parameters)  # 7.4's

    def _open_widget_subshell(self) -> None:  # in the shell channel thread
        try:
            subshell_id = self.shell_channel_thread.manager._create_subshell()
        except Exception:
            log.exception("monarch_nb: could not open the widget subshell")
            return
        self._widget_thread_name = f"subshell-{subshell_id}"
        self.widget_subshell_id = subshell_id

    async def shell_channel_thread_main(self, msg):
        """Route one shell message (in the shell channel thread): to the widget subshell
        when it is one of those above, else as ipykernel does."""
        frames, subshell_id = self._for_widget_subshell(msg), self.widget_subshell_id
        if frames is not None and subshell_id is not None:
            async with self.shell_channel_thread.asyncio_lock:  # as ipykernel's routing
                try:
                    socket = self.shell_channel_thread.manager.get_shell_channel_to_subshell_socket(subshell_id)
                except KeyError:  # a client deleted it (delete_subshell_request): route as ipykernel does
                    self.widget_subshell_id = None
                else:
                    socket.send_multipart(frames, copy=False)
                    return
        await super().shell_channel_thread_main(msg)

    def _for_widget_subshell(self, msg) -> list | None:
        """The frames to send to the widget subshell (``msg``, or ``msg`` with the
        subshell's id in its header, re-signed), or ``None`` to route as ipykernel does."""
        session = self.session
        if self.widget_subshell_id is None or session is None:
            return None
        try:
            idents, rest = session.feed_identities(msg, copy=False)
            header = session.deserialize(rest, content=False, copy=False)["header"]
            msg_type, on_main = header["msg_type"], header.get("subshell_id") is None
            if msg_type in ("kernel_info_request", "comm_info_request"):
                return self._addressed(session, idents, rest) if on_main else None
            if msg_type not in _COMM_TYPES:
                return None
            content = session.unpack(_bytes(rest[4]))
            comm_id = content.get("comm_id")
            if msg_type == "comm_open":
                if not (on_main and content.get("target_name") == CONTROL_TARGET):
                    return None
                self._control_comms.add(comm_id)
                return self._addressed(session, idents, rest)
            if comm_id in self._control_comms:
                if msg_type == "comm_close":
                    self._control_comms.discard(comm_id)
                return msg
            comm = self.comm_manager.comms.get(comm_id)
            return msg if getattr(comm, _MARK, False) else None
        except Exception:  # malformed or badly signed (deserialize checks): ipykernel's routing reports it
            return None

    def _addressed(self, session, idents: list, rest: list) -> list:
        """The message with the widget subshell's id in its header (ipykernel checks that
        a non-comm message names the subshell that handles it), signed anew."""
        from jupyter_client.session import DELIM

        parts = [_bytes(frame) for frame in rest]  # signature, header, parent, metadata, content, buffers
        header = session.unpack(parts[1])
        header["subshell_id"] = self.widget_subshell_id
        parts[1] = session.pack(header)
        parts[0] = session.sign(parts[1:5])
        return [*idents, DELIM, *parts]

    async def shell_main(self, subshell_id, msg):
        """Handle one message of a subshell; on the widget subshell, comm messages
        without busy/idle status (the kernel stays busy with the cell)."""
        if subshell_id is None or subshell_id != self.widget_subshell_id:
            return await super().shell_main(subshell_id, msg)
        _, rest = self.session.feed_identities(msg, copy=False)
        header = self.session.deserialize(rest, content=False, copy=False)["header"]
        if header["msg_type"] not in _COMM_TYPES:
            return await super().shell_main(subshell_id, msg)
        async with self.shell_channel_thread.manager.get_subshell_asyncio_lock(subshell_id):
            await self.dispatch_shell(msg, subshell_id=subshell_id, concurrent=True)
        if header["msg_type"] == "comm_open":  # the control comm: its request_states reads all widgets
            comm = self.comm_manager.comms.get(self.session.unpack(_bytes(rest[4])).get("comm_id"))
            callback = getattr(comm, "_msg_callback", None)
            if callback is not None:
                comm.on_msg(_retried(callback))

    async def comm_info_request(self, stream, ident, parent):
        await _retried_async(super().comm_info_request, stream, ident, parent)

    def set_parent(self, ident, parent, channel="shell"):
        """On the widget subshell, the parent is that thread's only: ipykernel would also
        make it the fallback parent of output from the user's threads (and of
        ``sys.stdout``), taking their output away from the running cell."""
        if channel == "shell" and threading.current_thread().name == getattr(self, "_widget_thread_name", None):
            self._shell_parent_ident.set(ident)
            self._shell_parent.set(parent)
            return
        super().set_parent(ident, parent, channel)


async def _retried_async(read, *args):
    for attempt in range(_RETRIES):
        try:
            with _few_thread_switches():
                result = read(*args)  # a coroutine in ipykernel 7, a value before
                return (await result) if inspect.isawaitable(result) else result
        except RuntimeError as e:
            if "changed size during iteration" not in str(e) or attempt == _RETRIES - 1:
                raise


def _bytes(frame) -> bytes:
    return bytes(frame.bytes) if hasattr(frame, "bytes") else bytes(frame)
