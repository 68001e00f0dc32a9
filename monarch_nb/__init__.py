"""monarch_nb: drive meshes of actors on a cluster from a Jupyter notebook.

The actor API lives in :mod:`monarch_nb.actor`; clusters are started and found with
``monarch_nb.Cluster.start(name)`` (on Slurm: ``allocator=monarch_nb.SlurmAllocator(nodes=2)``),
``monarch_nb.connect(name)`` and ``monarch_nb.list_clusters()``; Monarch's job API
(``ProcessJob``, ``SlurmJob``, ``SSHJob``...) is :mod:`monarch_nb.job`. See README.md.
"""

__version__ = "0.1.0"

_LAZY = {"Cluster", "connect", "list_clusters"}


def __getattr__(name: str):
    # Imported on first use, so `import monarch_nb` (the CLI, the kernel) stays cheap.
    if name in _LAZY:
        from .client import cluster

        return getattr(cluster, name)
    if name == "SlurmAllocator":
        from .allocators.slurm import SlurmAllocator

        return SlurmAllocator
    raise AttributeError(f"module 'monarch_nb' has no attribute {name!r}")


def load_ipython_extension(shell) -> None:
    """``%load_ext monarch_nb``: the ``%monarch`` magics and actor output in cells."""
    from .notebook import load_ipython_extension as load

    load(shell)


def unload_ipython_extension(shell) -> None:
    from .notebook import unload_ipython_extension as unload

    unload(shell)


__all__ = ["Cluster", "SlurmAllocator", "connect", "list_clusters", "__version__"]
