"""torch.distributed over a proc mesh: the torch elastic variables (what torchrun sets)
computed from the mesh and set in every proc, so that ``init_process_group()`` (its
default ``env://`` rendezvous) and DDP work in actors on one host or many.

Imports no torch, here or in the procs: setting variables needs none.
"""

from __future__ import annotations

from ..errors import ClusterError
from ..protocol import envelope, gpus, proc_ops
from ..mesh import Extent
from ..mesh.elastic import elastic_ranks
from ..wire.interfaces import host_of
from . import proc_ask
from .value_mesh import ValueMesh

# "ProcMesh" in annotations names ``proc_mesh.ProcMesh``, not imported: that module
# imports this one (``ProcMesh.setup_torch_distributed``).

BACKENDS = ("gloo", "nccl")
AUTO = "auto"  # nccl when every proc has a CUDA device, else gloo
TIMEOUT_S = 30.0  # for each round of control requests to the procs


def check_backend(backend: str) -> str:
    """``backend`` if it is one of :data:`BACKENDS` or :data:`AUTO`, else ``ValueError``
    naming them."""
    if backend not in BACKENDS and backend != AUTO:
        raise ValueError(f"backend={backend!r} is not a torch.distributed backend monarch_nb sets up; use "
                         f"{' or '.join(repr(b) for b in BACKENDS)} (gloo: CPU tensors, any host; nccl: CUDA tensors), "
                         f"or {AUTO!r} (nccl when every proc has a GPU)")
    return backend


def shared_gpus(reports: list[dict | None]) -> str | None:
    """Why NCCL would refuse these ranks, or ``None``: ``reports[r]`` is the CUDA device
    rank ``r`` would use (``proc.gpus.cuda_report``: its UUID, name and
    CUDA_VISIBLE_DEVICES), and two ranks on one GPU make NCCL fail with "Duplicate GPU
    detected" deep inside the first collective."""
    by_gpu: dict[str, list[int]] = {}
    for rank, report in enumerate(reports):
        if report:
            by_gpu.setdefault(report[gpus.CUDA_UUID], []).append(rank)
    clashes = [(uuid, ranks) for uuid, ranks in by_gpu.items() if len(ranks) > 1]
    if not clashes:
        return None
    uuid, ranks = clashes[0]
    first = reports[ranks[0]] or {}
    more = f" (and {len(clashes) - 1} more GPUs shared)" if len(clashes) > 1 else ""
    return (f"ranks {', '.join(map(str, ranks))} would share one GPU ({first.get(gpus.CUDA_NAME)} {uuid}, "
            f"CUDA_VISIBLE_DEVICES={first.get(gpus.CUDA_VISIBLE)}){more}, which NCCL refuses (\"Duplicate GPU "
            "detected\"); spawn the procs with one GPU each (spawn_procs(per_host={'gpus': N}) with N at most the "
            "host's GPUs, without gpus_per_proc below 1 or bind_gpus=False), or use backend='gloo'")


def _check_master(master_addr, master_port) -> None:
    if master_addr is not None and (not isinstance(master_addr, str) or not master_addr):
        raise ValueError(f"master_addr={master_addr!r}: give a host name or IP address string, or None "
                         "for rank 0's host")
    if master_port is not None and (isinstance(master_port, bool) or not isinstance(master_port, int)
                                    or not 0 < master_port < 65536):
        raise ValueError(f"master_port={master_port!r}: give a TCP port number 1-65535, or None for a free "
                         "port picked on rank 0's host")


def rank_env(extent: Extent, rank: int, master_addr: str, master_port: int) -> dict[str, str]:
    """The variables of ``rank`` of a mesh over ``extent``, as strings: MASTER_ADDR and
    MASTER_PORT, and its place as ``mesh.elastic.elastic_ranks`` computes it (RANK is
    the rank in the mesh, row-major; with a ``hosts`` dimension LOCAL_RANK is the place
    on its host and GROUP_RANK the host's index). ``spawn_procs`` sets the same place in
    procs of a ``"gpus"`` dimension when they start."""
    return {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), **elastic_ranks(extent, rank)}


def _ask(mesh: "ProcMesh", headers: list[dict], timeout: float) -> list[dict]:
    return proc_ask.ask(mesh, headers, timeout, "torch.distributed needs every proc of the mesh: set it up "
                        "on new procs, or on a slice without those ranks")


def _live_group_env(mesh: "ProcMesh", backend: str | None, master_addr, master_port,
                    states: list[dict]) -> list[dict] | None:
    """``None`` when no proc has a process group. When every proc already is rank r of
    one group of this mesh's size (and backend), the env those groups were made with:
    setting up again changes nothing. Otherwise :class:`ClusterError`."""
    groups = [s["group"] for s in states]
    if not any(groups):
        return None
    n = len(states)
    envs = [s["env"] for s in states]
    wrong = [r for r, g in enumerate(groups)
             if g is None or g["rank"] != r or g["world_size"] != n or (backend and backend not in g["backend"])]
    masters = {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}
    asked = (master_addr or envs[0]["MASTER_ADDR"], str(master_port) if master_port else envs[0]["MASTER_PORT"])
    if not wrong and len(masters) == 1 and asked in masters:
        return envs
    had = next(g for g in groups if g)
    ranks = [r for r, g in enumerate(groups) if g]
    raise ClusterError(
        f"proc mesh {mesh.name!r}: rank(s) {', '.join(map(str, ranks))} already belong to a torch process group "
        f"(backend {had['backend']}, world size {had['world_size']}) that this setup (backend {backend or 'any'}, "
        f"world size {n}, master {asked[0]}:{asked[1]}) would not match; call "
        "torch.distributed.destroy_process_group() in an actor on each of those procs first, or use new procs")


def setup(mesh: "ProcMesh", backend: str | None = None, master_addr: str | None = None,
          master_port: int | None = None, timeout: float = TIMEOUT_S) -> ValueMesh:
    """Set the torch elastic variables in every proc of ``mesh``; see
    ``ProcMesh.setup_torch_distributed``. ``backend=None`` accepts any live group.
    Unless ``backend="gloo"``, when every proc has a CUDA device each one's current
    device is set (``AUTO`` then means NCCL), after checking that no two share one."""
    if backend is not None:
        check_backend(backend)
    _check_master(master_addr, master_port)
    mesh._refresh()  # a restart may have replaced procs since this handle was made
    n = len(mesh)
    query = [{envelope.OP: proc_ops.TORCH_ENV_QUERY, "free_port": r == 0 and master_port is None,
              gpus.CUDA: backend != "gloo", gpus.LOCAL_RANK: int(elastic_ranks(mesh.extent, r)["LOCAL_RANK"])}
             for r in range(n)]
    states = _ask(mesh, query, timeout)
    reports = [s.get(gpus.CUDA) for s in states]
    on_gpus = backend != "gloo" and all(reports)
    if backend == AUTO:
        backend = "nccl" if on_gpus else "gloo"
    if on_gpus and (clash := shared_gpus(reports)):
        raise ValueError(f"proc mesh {mesh.name!r}: {clash}")
    envs = _live_group_env(mesh, backend, master_addr, master_port, states)
    if envs is None:
        rank0 = mesh._procs[mesh._shape.base_rank(0)]
        addr = master_addr or host_of(rank0["address"])
        port = master_port or states[0]["picked_port"]
        wanted = [rank_env(mesh.extent, r, addr, port) for r in range(n)]
        ips = [host_of(mesh._procs[b]["address"]) for b in mesh._shape.base_ranks()]
        devices = [report[gpus.CUDA_DEVICE] if on_gpus and report else None for report in reports]
        envs = [s["env"] for s in _ask(mesh, [{envelope.OP: proc_ops.TORCH_ENV_SET, "env": e, "ip": ip,
                                               gpus.DEVICE: d} for e, ip, d in zip(wanted, ips, devices)], timeout)]
        # a restarted proc starts with the same variables
        mesh._control().set_rank_env(mesh._name, {b: e for b, e in zip(mesh._shape.base_ranks(), envs)})
    return ValueMesh(mesh.extent, envs)

