"""Monarch's ``monarch.spmd`` entry point: torchrun-style SPMD over a proc mesh.

    from monarch_nb.spmd import setup_torch_elastic_env
    setup_torch_elastic_env(procs)        # then init_process_group() in the actors
    await setup_torch_elastic_env_async(procs)   # the same, awaited

Same as ``ProcMesh.setup_torch_distributed`` without a backend to check.
"""

from __future__ import annotations

from .client import torch_env
from .client.proc_mesh import ProcMesh
from .client.value_mesh import ValueMesh


def setup_torch_elastic_env(proc_mesh: ProcMesh, master_addr: str | None = None,
                            master_port: int | None = None) -> ValueMesh:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT in every proc of ``proc_mesh`` (see
    ``ProcMesh.setup_torch_distributed``, which this is with any backend accepted).
    Blocking; returns a ``ValueMesh`` of each rank's variables. Raises ``ValueError``
    for a bad address or port, :class:`ClusterError` when some procs already hold a
    process group that doesn't match this mesh, or a proc does not answer."""
    return torch_env.setup(proc_mesh, None, master_addr, master_port)


async def setup_torch_elastic_env_async(proc_mesh: ProcMesh, master_addr: str | None = None,
                                        master_port: int | None = None) -> ValueMesh:
    """:func:`setup_torch_elastic_env` for ``await`` (Monarch's name). It runs to
    completion when awaited, blocking the awaiting loop for its hub round trips."""
    return setup_torch_elastic_env(proc_mesh, master_addr, master_port)


__all__ = ["setup_torch_elastic_env", "setup_torch_elastic_env_async"]
