"""Monarch's ``monarch.spmd`` entry point: torchrun-style SPMD over a proc mesh.

    from monarch_nb.spmd import setup_torch_elastic_env
    setup_torch_elastic_env(procs)        # then init_process_group() in the actors
    await setup_torch_elastic_env_async(procs)   # the same, awaited
    actors = procs.spawn("spmd", SPMDActor)     # or run a torchrun script in every proc:
    actors.main.call(master_addr, master_port, ["train.py", "--lr", "0.1"]).get()

``setup_torch_elastic_env`` is ``ProcMesh.setup_torch_distributed`` without a backend
to check.
"""

from __future__ import annotations

import os
import runpy
import socket
import sys

from .client import torch_env
from .client.proc_mesh import ProcMesh
from .client.value_mesh import ValueMesh
from .proc import gpus
from .proc import torch_env as proc_torch_env
from .proc.actor import Actor, current_rank, endpoint
from .protocol import gpus as gpu_keys


def setup_torch_elastic_env(proc_mesh: ProcMesh, master_addr: str | None = None,
                            master_port: int | None = None) -> ValueMesh:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT in every proc of ``proc_mesh`` (see
    ``ProcMesh.setup_torch_distributed``, which this is with any backend accepted; on
    procs that each have a CUDA device it sets each one's device, and raises
    ``ValueError`` when two ranks would share one GPU).
    Blocking; returns a ``ValueMesh`` of each rank's variables. Raises ``ValueError``
    for a bad address or port, :class:`ClusterError` when some procs already hold a
    process group that doesn't match this mesh, or a proc does not answer."""
    return torch_env.setup(proc_mesh, None, master_addr, master_port)


async def setup_torch_elastic_env_async(proc_mesh: ProcMesh, master_addr: str | None = None,
                                        master_port: int | None = None) -> ValueMesh:
    """:func:`setup_torch_elastic_env` for ``await`` (Monarch's name). It runs to
    completion when awaited, blocking the awaiting loop for its hub round trips."""
    return setup_torch_elastic_env(proc_mesh, master_addr, master_port)


class SPMDActor(Actor):
    """Monarch's torchrun stand-in: one per proc, it sets the torch elastic variables of
    its rank (as ``setup_torch_elastic_env`` computes them from the mesh, plus
    ``ROLE_RANK``/``ROLE_WORLD_SIZE``/``ROLE_NAME``), sets its CUDA device when it has
    one, and runs training scripts. Two ranks sharing a GPU are not caught here (each
    actor sees only itself): ``setup_torch_elastic_env`` first says so."""

    @endpoint
    def get_host_port(self, use_ipaddr=None) -> tuple[str, int]:
        """This host's name and a TCP port free on it now, for ``MASTER_ADDR``/``MASTER_PORT``
        (``use_ipaddr`` is accepted for Monarch compatibility; the name is returned)."""
        return socket.gethostname(), proc_torch_env.free_port()

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        """Set this proc's torch elastic variables (``os.environ``)."""
        self._setup_env(master_addr, master_port)

    @endpoint
    def main(self, master_addr: str, master_port: int, script_args: list[str]) -> bool:
        """Set the variables, then run ``script_args`` as torchrun would: ``["-m",
        "pkg.mod", *args]`` runs a module, ``["train.py", *args]`` a script, as
        ``__main__`` with ``sys.argv`` set. Returns ``True`` when it returned; raises
        ``ValueError`` for empty ``script_args`` and whatever the script raises."""
        self._setup_env(master_addr, master_port)
        if not script_args or script_args == ["-m"]:
            raise ValueError("SPMDActor.main needs a script path or '-m module' in script_args")
        if script_args[0] == "-m":
            sys.argv = list(script_args[1:])
            runpy.run_module(script_args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(script_args)
            runpy.run_path(script_args[0], run_name="__main__")
        return True

    def _setup_env(self, master_addr: str, master_port: int) -> None:
        """The variables, and (on a proc with a CUDA device) the rank's current device:
        device 0 of a proc bound to one GPU, else its LOCAL_RANK's."""
        point = current_rank()
        env = torch_env.rank_env(point.extent, point.rank, master_addr, master_port)
        os.environ.update(env, ROLE_RANK=env["RANK"], ROLE_WORLD_SIZE=env["WORLD_SIZE"], ROLE_NAME="rank")
        cuda = gpus.cuda_report(int(env["LOCAL_RANK"]))
        if cuda is not None:
            gpus.set_device(cuda[gpu_keys.CUDA_DEVICE])


__all__ = ["SPMDActor", "setup_torch_elastic_env", "setup_torch_elastic_env_async"]
