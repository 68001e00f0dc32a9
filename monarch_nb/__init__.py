"""monarch_nb: drive meshes of actors on a cluster from a Jupyter notebook.

The actor API lives in :mod:`monarch_nb.actor`; see README.md.
"""

__version__ = "0.1.0"
