"""How IPython shows monarch_nb objects. Loaded lazily (``Cluster._ipython_display_`` and
``_repr_mimebundle_`` import it when IPython asks), so display code stays in the notebook
layer and the client works without IPython or ipywidgets installed.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from .. import health_view
from ..errors import MonarchNbError

if TYPE_CHECKING:
    from .health_widget import HealthWidget

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def widgets_render() -> bool:
    """True in a kernel with a frontend (where a widget can show) and ipywidgets
    installed; not in a terminal."""
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if getattr(shell, "kernel", None) is None:
        return False
    try:
        return importlib.util.find_spec("ipywidgets") is not None
    except (ImportError, ValueError):  # blocked (sys.modules entry None) or broken
        return False


def cluster_mimebundle(cluster) -> dict:
    """What IPython shows for ``cluster``: the live health widget (in a kernel with
    ipywidgets), the tree as ``text/html`` and as ``text/plain``. One hub round trip
    (~ms)."""
    return _bundle_and_widget(cluster)[0]


def _bundle_and_widget(cluster) -> tuple[dict, HealthWidget | None]:
    """``cluster_mimebundle``'s bundle, and the ``HealthWidget`` in it (``None`` if none)."""
    if cluster._stopped:
        return {"text/plain": f"{cluster!r} (stopped)"}, None
    try:
        tree = cluster.health()
    except MonarchNbError as e:
        return {"text/plain": f"{cluster!r}: no health tree: {e}"}, None
    bundle = {"text/plain": health_view.to_plain(tree), "text/html": health_view.to_html(tree)}
    if not widgets_render():
        return bundle, None
    from .health_widget import widget_for

    widget = widget_for(cluster, tree)
    bundle[WIDGET_VIEW] = widget._repr_mimebundle_()[WIDGET_VIEW]
    return bundle, widget


def show_cluster(cluster) -> None:
    """Display ``cluster`` (``cluster`` as a cell's last line, ``display(cluster)``,
    ``%monarch status``): the bundle of ``cluster_mimebundle``, as ``display_data``. A
    live widget gets a ``display_id`` so that, when the kernel goes, the output turns
    into a static snapshot of the tree (``live_displays``) instead of a dead widget."""
    from IPython.display import display

    bundle, widget = _bundle_and_widget(cluster)
    if widget is None:
        display(bundle, raw=True)
        return
    from . import live_displays

    live_displays.show(bundle, widget.snapshot)

