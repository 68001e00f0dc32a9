"""The ``monarch`` Jupyter kernel: the IPython kernel with monarch_nb built in.

At start it loads the ``monarch_nb`` extension (``%monarch`` magics, actor output
under cells) and connects to the retained cluster named by ``MONARCH_NB_CLUSTER``
(default ``default``) when that cluster is running, binding it to ``cluster`` in the
user's namespace; the first cell's output says so and how to get mesh handles.
Shutting the kernel down or restarting it never stops the cluster; live health widgets
of earlier outputs turn into static snapshots of their trees then. Widget messages of a
frontend that (re)loads the notebook are answered on a subshell of the kernel, so the
health tree renders (and opens and closes) while a cell blocks
(``notebook.widget_subshell``).
"""

from __future__ import annotations

import os

from ipykernel.ipkernel import IPythonKernel

from .notebook.widget_subshell import WidgetSubshellKernel

CLUSTER_ENV = "MONARCH_NB_CLUSTER"


class MonarchKernel(WidgetSubshellKernel, IPythonKernel):
    implementation = "monarch_nb"
    banner = "Monarch (Python 3) - drive meshes of actors from this kernel"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.shell.extension_manager.load_extension("monarch_nb")
        self._greeting = self._connect(self.shell.user_ns)
        if self._greeting:
            self.shell.events.register("pre_run_cell", self._greet)

    @staticmethod
    def _connect(namespace: dict) -> str:
        """Connect to the cluster and bind it to ``cluster`` in ``namespace``; returns
        what the first cell shows ("" when there is no cluster to connect to)."""
        from .client import cluster as cluster_mod
        from .client import discovery
        from .protocol.states import DiscoveryState

        name = os.environ.get(CLUSTER_ENV, cluster_mod.DEFAULT_NAME)
        try:
            if discovery.probe(name).state != DiscoveryState.RUNNING:
                return ""
            cluster = cluster_mod.connect(name)
            info = cluster.info()
        except Exception as e:  # never keep the kernel from starting
            return f"monarch: could not connect to cluster {name!r}: {e}"
        namespace["cluster"] = cluster
        meshes = [key.rpartition("/")[2] for key in info["actor_meshes"] if not key.endswith(".exec")]
        example = f"cluster.actor_meshes[{meshes[0]!r}]" if meshes else "cluster.actor_meshes['NAME']"
        return (f"monarch: connected to cluster {name!r} ({len(info['hosts'])} host(s), "
                f"proc meshes: {', '.join(info['proc_meshes']) or 'none'}, "
                f"actor meshes: {', '.join(info['actor_meshes']) or 'none'})\n"
                f"monarch: it is `cluster`; mesh handles: {example}, cluster.proc_meshes[...]")

    def do_shutdown(self, restart):
        """Before the kernel goes (restart or shutdown; the frontend's request, over the
        control channel): every live widget display of a cluster turns into a static
        snapshot of its tree, sent on IOPub before the shutdown reply."""
        from .notebook import live_displays

        try:
            live_displays.snapshot_all(self, restart)
        except Exception:  # noqa: BLE001 - a snapshot must never keep the kernel from going
            self.log.exception("monarch_nb: could not replace the live widgets by snapshots")
        return super().do_shutdown(restart)

    def _greet(self, info=None) -> None:
        print(self._greeting)
        self.shell.events.unregister("pre_run_cell", self._greet)


if __name__ == "__main__":
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=MonarchKernel)
