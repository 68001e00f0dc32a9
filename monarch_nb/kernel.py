"""The ``monarch`` Jupyter kernel: an IPython kernel for monarch_nb notebooks.

For now it is the stock IPython kernel under its own name; the ``%monarch`` magics
and reconnecting to a retained cluster at start arrive with the notebook layer.
"""

from __future__ import annotations

from ipykernel.ipkernel import IPythonKernel


class MonarchKernel(IPythonKernel):
    implementation = "monarch_nb"
    banner = "Monarch (Python 3) - drive meshes of actors from this kernel"


if __name__ == "__main__":
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=MonarchKernel)
