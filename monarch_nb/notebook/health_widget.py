"""The live health tree in a notebook: an ipywidgets tree of hosts -> procs -> actors and
actor meshes -> actors, with a summary line, a colour per state and levels the user
opens and closes.

Each node is a few widgets whose values are updated in place as new trees arrive
(from ``client.health_watch``: deltas the hub pushes, figures refreshed every 1 s,
at most 4 redraws a second), so what the user opened stays open; widgets are made only for nodes whose
parent is open, and closed when their node goes away. Levels open and close through
the kernel (a click is a comm message). In the ``monarch`` kernel the tree's messages are
answered on its widget subshell (``widget_subshell``), so a click works, and a reloaded
page shows the tree, while a cell blocks on a call; there the click's handler runs in
that subshell's thread, beside the feed's thread, both under the widget's lock. In
another kernel they wait for the running cell.

A displayed cluster (``cluster`` as a cell's last line, ``display(cluster)``,
``%monarch status``) shows this widget plus ``text/html`` and ``text/plain`` versions
of the tree for places where widgets don't render (nbconvert, GitHub). One widget per
cluster object: displaying it again shows the same live widget.
"""

from __future__ import annotations

import html
import threading

from ipywidgets import HTML, Button, HBox, Layout, VBox

from .. import health_view
from ..client.health_watch import MIN_INTERVAL_S, TICK_S, HealthWatch
from . import widget_subshell

_TOGGLE_WIDTH = "24px"
_OPEN, _CLOSED = "▾", "▸"

# When its kernel goes, a frontend keeps the widgets it has but marks every one
# disconnected (``jupyter-widgets-disconnected``): JupyterLab draws a broken-link icon on
# each nested widget and the toggles stop answering. A JupyterLab restart drops whatever
# the dying kernel sends (it forgets the kernel's requests and comms first), so the
# static snapshot of ``live_displays`` can't reach that page; this stylesheet, part of
# the widget, makes the disconnected tree read as the snapshot it is instead: no icons,
# inert toggles, and a line saying the tree is no longer live. Styles only the tree.
_GONE_HTML = (
    "<style>"
    ".mnb-health.jupyter-widgets-disconnected::before,"
    ".mnb-health .jupyter-widgets-disconnected::before{display:none}"
    ".mnb-health.jupyter-widgets-disconnected>.mnb-gone{display:flex!important;color:#757575}"
    ".mnb-health.jupyter-widgets-disconnected .widget-button{pointer-events:none;opacity:0.4}"
    "</style>"
    "snapshot: the kernel that drew this tree has restarted or shut down, so it no longer "
    "updates; display the cluster again for a live tree")


class _NodeView:
    """The widgets of one node: its line (a toggle for nodes that can have children,
    and an HTML label) and, while open, the views of its children."""

    def __init__(self, node: health_view.Node, lock: threading.RLock):
        self.key = node.key
        self.open = node.open
        self._lock = lock
        self._node = node
        self._children: dict[str, _NodeView] = {}
        self.label = HTML()
        if node.kind in ("section", "host", "proc", "mesh"):
            self.toggle = Button(description=_OPEN if self.open else _CLOSED, tooltip="open / close",
                                 style={"button_color": "transparent"},
                                 layout=Layout(width=_TOGGLE_WIDTH, height="22px", padding="0", margin="0 4px 0 0"))
            self.toggle.on_click(self._on_toggle)
            self.body = VBox(layout=Layout(margin=f"0 0 0 {_TOGGLE_WIDTH}", display="flex" if self.open else "none"))
            self.row = HBox([self.toggle, self.label], layout=Layout(align_items="center"))
            self.widget = VBox([self.row, self.body])
        else:  # a leaf: its label, aligned with its siblings' labels
            self.toggle = self.body = self.row = None
            self.label.layout.margin = f"0 0 0 calc({_TOGGLE_WIDTH} + 4px)"
            self.widget = self.label
        widget_subshell.mark(self.label, self.toggle, self.row, self.body, self.widget)

    def update(self, node: health_view.Node) -> None:
        """Show ``node`` (same key): the label, and the children when open."""
        self._node = node
        label = health_view.label_html(node)
        if self.label.value != label:  # an unchanged value sends nothing to the frontend
            self.label.value = label
        if self.toggle is not None:
            visibility = "visible" if node.children else "hidden"
            if self.toggle.layout.visibility != visibility:
                self.toggle.layout.visibility = visibility
            if self.open:
                self._sync_children()

    def _sync_children(self) -> None:
        kept = self._children = _reconcile(self._children, self._node.children, self._lock)
        widgets = tuple(v.widget for v in kept.values())
        if self.body.children != widgets:
            self.body.children = widgets

    def _on_toggle(self, _button=None) -> None:
        with self._lock:
            self.set_open(not self.open)

    def set_open(self, open_: bool) -> None:
        """Open (showing the children as of the latest tree) or close this node."""
        if self.toggle is None:
            return
        self.open = open_
        if open_:
            self._sync_children()
        self.toggle.description = _OPEN if open_ else _CLOSED
        self.body.layout.display = "flex" if open_ else "none"

    def find(self, key: str) -> "_NodeView | None":
        """The view of ``key`` among this node and its shown descendants."""
        if key == self.key:
            return self
        if not self.open:
            return None
        for child in self._children.values():
            found = child.find(key)
            if found is not None:
                return found
        return None

    def close(self) -> None:
        for child in self._children.values():
            child.close()
        self._children = {}
        for w in (self.label, self.toggle, self.row, self.body, self.widget):
            if w is not None:
                w.close()


def _reconcile(views: dict[str, _NodeView], nodes, lock: threading.RLock) -> dict[str, _NodeView]:
    """Views for ``nodes`` by key: existing ones updated in place (so what the user
    opened stays open), new ones made, those of vanished nodes closed."""
    kept: dict[str, _NodeView] = {}
    for node in nodes:
        view = views.pop(node.key, None) or _NodeView(node, lock)
        view.update(node)
        kept[node.key] = view
    for gone in views.values():
        gone.close()
    return kept


class HealthWidget(VBox):
    """A cluster's health tree as a live widget. ``tree``: the latest health tree shown
    (``None`` before the first); ``ended``: why live updates stopped (``None`` while
    live). Updates stop when the widget is closed, the cluster is stopped (every node
    turns ``stopped``) or disconnected, or its hub fails.

    ``initial``: a health tree to show at once (else the first one arrives from the
    hub within a round trip). ``tick_s``/``min_interval_s``: see ``HealthWatch``."""

    def __init__(self, cluster, initial: dict | None = None, tick_s: float = TICK_S,
                 min_interval_s: float = MIN_INTERVAL_S):
        self._lock = threading.RLock()
        self._summary = HTML(f"cluster <b>{html.escape(cluster.name)}</b>: asking the hub…")
        # Hidden (its stylesheet applies all the same) until the kernel has gone.
        self._gone = HTML(_GONE_HTML, layout=Layout(display="none"))
        self._gone.add_class("mnb-gone")
        self._views: dict[str, _NodeView] = {}
        self._previous: dict | None = None
        self.tree: dict | None = None
        self.ended: str | None = None
        super().__init__([self._summary, self._gone], layout=Layout(overflow="auto"))
        self.add_class("mnb-health")
        widget_subshell.mark(self, self._summary)
        if initial is not None:
            self._show(initial)
        self._watch = HealthWatch(cluster, self._show, self._end, tick_s, min_interval_s, on_stale=self._stale)

    @property
    def refreshes(self) -> int:
        """How many trees the live feed has shown (the initial one not counted)."""
        return self._watch.refreshes

    def _show(self, tree: dict, note: str | None = None) -> None:
        with self._lock:
            if self.comm is None:  # closed meanwhile
                return
            self._previous, self.tree = self.tree, tree
            summary = health_view.summary_html(tree, note)
            if self._summary.value != summary:
                self._summary.value = summary
            kept = self._views = _reconcile(self._views, health_view.nodes(tree, self._previous), self._lock)
            children = (self._summary, self._gone, *(v.widget for v in kept.values()))
            if self.children != children:
                self.children = children

    def _stale(self, reason: str) -> None:
        """The hub is down: the tree stays, marked as the last one (the recovered hub's
        first tree replaces it, unmarked)."""
        if self.tree is None:
            self._summary.value = f"no health tree ({html.escape(reason)})"
        else:
            self._show(self.tree, note=reason)

    def _end(self, reason: str) -> None:
        self.ended = reason
        if self.tree is None:
            self._summary.value = f"no health tree ({html.escape(reason)})"
        elif reason == "cluster stopped":
            self._show(health_view.as_stopped(self.tree))
        else:
            self._show(self.tree, note=reason)

    def snapshot(self, why: str) -> dict:
        """The tree shown now as static ``text/html`` + ``text/plain`` (no widget), its
        summary line noting ``why`` it is no longer live (and why updates ended, if
        they did): what replaces this widget's displays when the kernel goes."""
        note = why if self.ended is None else f"{self.ended}; {why}"
        if self.tree is None:
            return {"text/plain": f"no health tree ({note})"}
        return {"text/plain": health_view.to_plain(self.tree, note=note),
                "text/html": health_view.to_html(self.tree, note=note)}

    def find(self, key: str) -> _NodeView | None:
        """The view of the node ``key`` (``proc:MESH/RANK``, ...; see
        ``monarch_nb.health_view``), if it is shown (its parents open)."""
        with self._lock:  # the loop in a method of its own: see monarch_nb.wire.interrupts
            return self._find_shown(key)

    def _find_shown(self, key: str) -> _NodeView | None:
        """:meth:`find`'s search of the views (the caller holds the lock)."""
        for view in self._views.values():
            found = view.find(key)
            if found is not None:
                return found
        return None

    def state_of(self, key: str) -> str | None:
        """The state the widget shows for node ``key`` (``None`` if not shown)."""
        view = self.find(key)
        if view is None:
            return None
        value = view.label.value
        marker = 'data-mnb-state="'
        start = value.find(marker) + len(marker)
        return value[start:value.find('"', start)]

    def close(self) -> None:
        """Stop live updates and close every widget of the tree."""
        watch = getattr(self, "_watch", None)
        if watch is not None:
            watch.stop(timeout=5)
        with self._lock:
            for view in self._views.values():
                view.close()
            self._views = {}
            self._summary.close()
            self._gone.close()
            super().close()


_widgets_lock = threading.Lock()


def widget_for(cluster, initial: dict | None = None) -> HealthWidget:
    """The live health widget of ``cluster``, made on first use (and anew once the old
    one was closed or its live updates ended, e.g. after its hub was recovered)."""
    with _widgets_lock:  # kept on the cluster object: it lives (and goes) with it
        widget = getattr(cluster, "_health_widget", None)
        if widget is None or widget.comm is None or widget.ended is not None:
            widget = cluster._health_widget = HealthWidget(cluster, initial)
        return widget
