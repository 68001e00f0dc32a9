"""How IPython shows monarch_nb objects. Loaded lazily (``Cluster._repr_mimebundle_``
imports it when IPython asks), so display code stays in the notebook layer and the
client works without IPython or ipywidgets installed.
"""

from __future__ import annotations

import importlib.util

from .. import health_view
from ..errors import MonarchNbError


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
    if cluster._stopped:
        return {"text/plain": f"{cluster!r} (stopped)"}
    try:
        tree = cluster.health()
    except MonarchNbError as e:
        return {"text/plain": f"{cluster!r}: no health tree: {e}"}
    bundle = {"text/plain": health_view.to_plain(tree), "text/html": health_view.to_html(tree)}
    if widgets_render():
        from .health_widget import widget_for

        view = widget_for(cluster, tree)._repr_mimebundle_()
        bundle["application/vnd.jupyter.widget-view+json"] = view["application/vnd.jupyter.widget-view+json"]
    return bundle
