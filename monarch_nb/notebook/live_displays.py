"""Live widget displays that turn into static snapshots when their kernel goes.

A widget output is only a reference to a model that lives in the kernel: once the kernel
restarts or shuts down, a frontend shows a broken link for every nested widget (and,
after a page reload, "model not found"), even though the same output carries a
``text/html`` version. So every live display is published with a ``display_id``, and
when the kernel goes (``snapshot_all``: ``MonarchKernel.do_shutdown``; in any IPython
kernel, the shell's ``exit_now`` turning true, which ``IPythonKernel.do_shutdown`` and
``quit()`` do) each one is replaced, through ``update_display_data``, by its static
``text/html`` + ``text/plain`` snapshot stamped with the time. The replacement lands in
the notebook document too, so a saved notebook shows a readable tree, not a dead widget.

A frontend only applies the update while it still listens to the dying kernel: a
``jupyter_client`` consumer, a kernel restarted or shut down through the server's REST
API, JupyterLab's "Shut Down Kernel". JupyterLab's own "Restart Kernel" forgets the
kernel's requests before it asks the server to restart (``KernelConnection.restart``
clears its futures and display ids first), so it drops these messages; the widget's own
stylesheet covers that case (``health_widget``: the disconnected tree reads as a
snapshot).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Callable

_FLUSH_S = 2.0  # how long the kernel waits for the snapshots to leave on IOPub
# Displays kept live, newest first: each costs a snapshot message when the kernel goes
# (within the ~5 s a server waits for a kernel to exit), and a re-run cell's old display
# is usually gone from the page anyway. Older ones stay dead widgets.
MAX_LIVE = 64

# A static bundle for a display, given why it stops being live ("kernel restarted").
# Displays sharing an equal snapshot (e.g. the same widget's bound method) share one.
Snapshot = Callable[[str], dict]

_lock = threading.Lock()
_live: dict[str, tuple[Snapshot, dict]] = {}  # display_id -> (snapshot, parent header of the display)
_watched: set[int] = set()  # ids of the shells whose exit_now is observed


def show(bundle: dict, snapshot: Snapshot) -> str:
    """Display ``bundle`` (a mime bundle holding a widget view) in the running kernel
    with a new ``display_id``, which is returned; ``snapshot(why)`` gives the static
    bundle that replaces it when the kernel goes (for the latest ``MAX_LIVE`` displays).
    Needs an IPython kernel."""
    from IPython import get_ipython
    from IPython.display import display

    display_id = uuid.uuid4().hex
    shell = get_ipython()
    parent = dict(getattr(shell.display_pub, "parent_header", None) or {})
    display(bundle, raw=True, display_id=display_id)
    with _lock:  # the loop in a function of its own: see monarch_nb.wire.interrupts
        _keep_live(display_id, (snapshot, parent))
        watch = id(shell) not in _watched
        _watched.add(id(shell))
    if watch:  # not the process's exit: a kernel holding a cluster may be killed before that
        shell.observe(_on_exit_now, names="exit_now")
    return display_id


def _keep_live(display_id: str, entry: tuple[Snapshot, dict]) -> None:
    """Add ``entry`` to the live displays, dropping the oldest past ``MAX_LIVE`` (the
    caller holds ``_lock``)."""
    _live[display_id] = entry
    while len(_live) > MAX_LIVE:
        del _live[next(iter(_live))]


def live() -> list[str]:
    """The display ids that are still live widgets (in display order)."""
    with _lock:
        return list(_live)


def snapshot_all(kernel, restart: bool | None) -> int:
    """Replace every live display by its static snapshot (``update_display_data``, no
    widget view), stamped with the time and whether the kernel restarted (``restart``;
    ``None``: unknown), and wait up to 2 s until IOPub has sent them. Returns how many
    were sent. Safe from any thread; later calls send nothing more."""
    with _lock:
        displays = list(_live.items())
        _live.clear()
    session = getattr(kernel, "session", None)
    iopub = getattr(kernel, "iopub_socket", None)
    if not displays or session is None or iopub is None:
        return 0
    event = "kernel restarted" if restart else "kernel shut down" if restart is False else "kernel ended"
    why = f"snapshot at {time.strftime('%H:%M:%S')}, {event}"
    topic = f"kernel.{getattr(kernel, 'ident', '')}.update_display_data".encode()
    sent = 0
    made: dict[Snapshot, dict] = {}
    for display_id, (snapshot, parent) in displays:
        if snapshot not in made:
            try:
                made[snapshot] = snapshot(why)
            except Exception as e:  # one broken display must not keep the others live
                made[snapshot] = {"text/plain": f"(no snapshot: {type(e).__name__}: {e})"}
        data = made[snapshot]
        content = {"data": data, "metadata": {}, "transient": {"display_id": display_id}}
        session.send(iopub, "update_display_data", content, parent=parent, ident=topic)
        sent += 1
    _flush(kernel)
    return sent


def _flush(kernel) -> None:
    """Wait until the IOPub thread has handed what was sent before to its socket (whose
    linger then delivers it while the kernel exits)."""
    thread = getattr(kernel, "iopub_thread", None)
    if thread is None or not thread.thread.is_alive():
        return  # sends happen inline then
    done = threading.Event()
    thread.schedule(done.set)
    done.wait(_FLUSH_S)


def _on_exit_now(change) -> None:
    kernel = getattr(change["owner"], "kernel", None)
    if not change["new"] or kernel is None:
        return
    request = kernel.get_parent("control") or {}  # the shutdown_request being handled, if any
    restart = (request.get("content", {}).get("restart")
               if request.get("header", {}).get("msg_type") == "shutdown_request" else None)
    try:
        snapshot_all(kernel, restart)
    except Exception:  # noqa: BLE001 - an observer that raises would break the kernel's own shutdown
        import traceback

        traceback.print_exc()
