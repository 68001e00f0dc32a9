"""Which GPU each proc of a ``"gpus"`` dimension gets, decided by the hub at
``spawn_procs`` before any proc starts, from the inventories the host agents reported.

A proc's binding is environment, set by its host agent when it starts the proc (and
again when it is restarted): ``CUDA_VISIBLE_DEVICES`` naming its GPU(s) from its host's
inventory (none on a host without GPUs, or with ``bind_gpus=False``), and torch
elastic's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE
(``mesh.elastic``), which ``setup_torch_distributed`` later sets to the same values.

Procs take the GPUs no live proc of another mesh is bound to, in their order on the
host (proc ``i`` of a host: its ``i``-th free GPU), ``gpus_per_proc`` at a time; a
fraction ``1/k`` lets ``k`` procs share each GPU. So two meshes on one host (replica
groups, a trainer beside a generator) get different GPUs, and a stopped mesh's GPUs
are free again. (A failed proc's GPU is free too: its restart takes it back without
checking that no newer mesh took it.)

Host agents on one machine (a local cluster of several hosts) see the same GPUs; they
split them: of ``m`` agents of one machine reporting the same inventory, the ``j``-th
(in host order) gets the ``j``-th of ``m`` contiguous slices of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from ..mesh import Extent
from ..mesh.elastic import elastic_ranks
from ..proc.gpus import VISIBLE_ENV
from ..protocol import gpus as proto

GPUS = "gpus"  # the dimension whose procs are bound to GPUs


@dataclass(frozen=True)
class Share:
    """A host agent's GPUs: ``gpus`` (records), its slice of its ``machine``'s
    ``of_machine`` GPUs, split between ``agents`` agents there (1: not split)."""
    gpus: list[dict]
    machine: str
    of_machine: int
    agents: int


def parse_gpus_per_proc(value) -> tuple[int, int]:
    """``gpus_per_proc`` as ``(gpus each proc gets, procs sharing one GPU)``: ``2`` ->
    ``(2, 1)``, ``0.5`` -> ``(1, 2)``, ``1`` -> ``(1, 1)``. Raises ``ValueError`` for
    anything but a whole number >= 1 or a fraction 1/k (0.5, 0.25, 1/3...)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)) or not value > 0:
        raise ValueError(f"gpus_per_proc={value!r}: give a whole number of GPUs per proc (1, 2, ...) or a "
                         "fraction 1/k for k procs per GPU (0.5, 0.25)")
    if value >= 1:
        if value != int(value):
            raise ValueError(f"gpus_per_proc={value!r}: more than one GPU per proc must be a whole number")
        return int(value), 1
    sharing = round(1 / value)
    if not math.isclose(sharing * value, 1.0, rel_tol=1e-9):
        raise ValueError(f"gpus_per_proc={value!r}: a GPU is shared by a whole number of procs: use 1/k "
                         "(0.5 for 2 procs per GPU, 0.25 for 4)")
    return 1, sharing


def shares(hosts: list[tuple[str, str, list[dict]]]) -> dict[str, Share]:
    """Each host agent's GPUs: ``hosts`` lists ``(host_id, machine, inventory)`` in host
    order, ``machine`` naming the machine an agent runs on (its hostname). Agents of one
    machine reporting the same inventory split it in contiguous slices, in host order;
    an agent with an inventory of its own (its own ``CUDA_VISIBLE_DEVICES``) keeps it."""
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for host_id, machine, inventory in hosts:
        if inventory:
            groups.setdefault((machine, tuple(g[proto.ID] for g in inventory)), []).append(host_id)
    found = {host_id: Share([], machine, 0, 1) for host_id, machine, _ in hosts}
    for (machine, ids), members in groups.items():
        inventory = next(inv for h, _, inv in hosts if h == members[0])
        n, m = len(ids), len(members)
        for j, host_id in enumerate(members):
            found[host_id] = Share(inventory[j * n // m:(j + 1) * n // m], machine, n, m)
    return found


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def _too_few(per_host: dict, host_id: str, procs: int, share: Share, needed: int, each: int,
             taken: dict[str, str]) -> ValueError:
    have = len(share.gpus)
    where = f"host {host_id} has {_n(have, 'GPU')}"
    if have:
        where += f" ({', '.join(g[proto.ID] for g in share.gpus)})"
    if share.agents > 1:
        where += (f": its machine {share.machine} has {share.of_machine}, split between the {share.agents} "
                  "host agents running there")
    free = have - len(taken)
    if taken:
        by_mesh: dict[str, list[str]] = {}
        for id_, mesh in taken.items():
            by_mesh.setdefault(mesh, []).append(id_)
        where += (f", {len(taken)} of them bound to the live procs of "
                  + ", ".join(f"{m!r} ({', '.join(ids)})" for m, ids in by_mesh.items()))
    wants = _n(procs, "proc") + (f" x {each} GPUs each" if each > 1 else "")
    fewer = f"spawn at most {_n(free // each, 'proc')} per host, " if free // each else ""
    stop = "stop those procs, " if taken else ""
    return ValueError(
        f"spawn_procs(per_host={per_host}) puts {wants} on host {host_id}, needing {_n(needed, 'GPU')}, but {where}; "
        f"{fewer}{stop}let procs share GPUs (gpus_per_proc=0.5: 2 procs per GPU), or pass bind_gpus=False to "
        "leave every GPU visible to every proc")


def plan(per_host: dict[str, int], host_extent: dict[str, int], host_ids: list[str], host_shares: dict[str, Share],
         bind_gpus: bool = True, gpus_per_proc: tuple[int, int] = (1, 1),
         busy: dict[str, dict[str, str]] | None = None) -> list[dict[str, str]]:
    """The environment of each proc of a new mesh, in rank order (host after host, procs
    of a host in ``per_host`` order), for a ``per_host`` with a ``"gpus"`` dimension
    (``[]`` without one: nothing is set). ``gpus_per_proc`` as :func:`parse_gpus_per_proc`
    gives it. ``busy``: host id -> GPU id -> the proc mesh whose live procs are bound to
    it; procs take the free GPUs of their host in order. Raises ``ValueError``, before
    anything starts, when a host with GPUs has too few free for its procs, naming the
    numbers, the meshes holding the others, and the ways out."""
    if GPUS not in per_host:
        return []
    extent = Extent({**host_extent, **per_host})
    per = Extent(per_host).nelements
    each, sharing = gpus_per_proc
    envs = []
    for h, host_id in enumerate(host_ids):
        share = host_shares.get(host_id, Share([], "", 0, 1))
        taken = {i: m for i, m in ((busy or {}).get(host_id) or {}).items() if i in {g[proto.ID] for g in share.gpus}}
        gpus = [g for g in share.gpus if g[proto.ID] not in taken] if bind_gpus else []
        needed = math.ceil(per * each / sharing)
        if bind_gpus and share.of_machine and needed > len(gpus):  # a host with GPUs, too few of them free
            raise _too_few(per_host, host_id, per, share, needed, each, taken)
        for i in range(per):
            env = elastic_ranks(extent, h * per + i)
            if gpus:
                first = i * each // sharing
                env[VISIBLE_ENV] = ",".join(g[proto.ID] for g in gpus[first:first + each])
            envs.append(env)
    return envs


def bound(procs: list[tuple[str, str, dict | None]]) -> dict[str, dict[str, str]]:
    """Host id -> GPU id -> proc mesh, for ``procs`` given as ``(proc mesh, host id,
    env set at its start)`` of live procs: the GPUs new procs can't take."""
    found: dict[str, dict[str, str]] = {}
    for mesh, host_id, env in procs:
        for id_ in filter(None, ((env or {}).get(VISIBLE_ENV) or "").split(",")):
            found.setdefault(host_id, {})[id_] = mesh
    return found


def gpus_of(inventory: list[dict], env: dict | None) -> list[dict]:
    """The GPU records of ``inventory`` that a proc's ``env`` binds it to (``[]`` when
    unbound)."""
    visible = (env or {}).get(VISIBLE_ENV)
    if not visible:
        return []
    by_id = {g[proto.ID]: g for g in inventory}
    return [by_id.get(i) or {proto.INDEX: None, proto.ID: i, proto.NAME: None, proto.MEMORY_MIB: None}
            for i in visible.split(",")]


def in_use(gpus: list[dict], status: dict | None) -> tuple[list[dict], dict[str, int]]:
    """A bound proc's ``gpus`` (records, as :func:`gpus_of` gives them) with the name
    its own CUDA report gives where the inventory had none, and the memory it uses on
    each: GPU id -> bytes, from its ``status`` (NVML's count by its agent, else torch's
    caching allocator when CUDA is up in the proc); ``{}`` when neither is known."""
    if not gpus or not status:
        return gpus, {}
    by_nvml = status.get(proto.GPU_USED_BYTES) or {}
    used = {}
    for g in gpus:
        found = by_nvml.get(g[proto.ID])
        if found is None and g.get(proto.INDEX) is not None:
            found = by_nvml.get(str(g[proto.INDEX]))
        if found is not None:
            used[g[proto.ID]] = found
    cuda = status.get(proto.STATUS_CUDA)
    device = cuda.get(proto.CUDA_DEVICE) if isinstance(cuda, dict) else None
    if isinstance(cuda, dict) and isinstance(device, int) and 0 <= device < len(gpus):  # torch's device d is the d-th GPU it was bound to
        g = gpus[device]
        if not g.get(proto.NAME) and cuda.get(proto.CUDA_NAME):
            gpus = [*gpus[:device], {**g, proto.NAME: cuda[proto.CUDA_NAME]}, *gpus[device + 1:]]
        used.setdefault(g[proto.ID], cuda.get(proto.USED_BYTES))
    return gpus, {k: v for k, v in used.items() if v is not None}
