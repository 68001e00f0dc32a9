"""A host's GPUs on the wire: the inventory a host agent reports when it registers, the
``spawn_procs`` options that bind procs to GPUs, and the keys of the CUDA facts a proc
reports to ``setup_torch_distributed``.

A GPU record is a dict with the keys below; an inventory is a list of them in the order
the host gives its GPUs (``CUDA_VISIBLE_DEVICES`` order, else NVML's index order).
"""

from __future__ import annotations

# hub_ops.AGENT_READY field: the host's GPU inventory (a list of GPU records, [] for none).
AGENT_GPUS = "gpus"

# GPU record keys.
INDEX = "index"  # int | None: the GPU's index on its machine (NVML's / nvidia-smi's), when known
ID = "id"  # str: how CUDA_VISIBLE_DEVICES names it: an index ("3") or a UUID ("GPU-...", "MIG-...")
NAME = "name"  # str | None: the model, e.g. "NVIDIA H200"
MEMORY_MIB = "memory_mib"  # int | None: total memory in MiB

# hub_ops.SPAWN_PROCS fields.
BIND_GPUS = "bind_gpus"  # bool: bind each proc of a "gpus" dimension to its GPU(s) (default True)
GPUS_PER_PROC = "gpus_per_proc"  # number: GPUs each proc gets (1, 2...), or 1/k: k procs share one

# proc_ops.TORCH_ENV_QUERY / TORCH_ENV_SET fields (ProcMesh.setup_torch_distributed).
CUDA = "cuda"  # query: report the CUDA device this rank would use (its local rank's); reply: that report
LOCAL_RANK = "local_rank"  # query: the rank's place on its host, which picks its device when it sees several
DEVICE = "device"  # set: torch.cuda.set_device(DEVICE) after the variables are set
# Keys of the CUDA report (None when the proc has no usable CUDA device).
CUDA_DEVICE = "device"  # int: the device index the rank would use
CUDA_UUID = "uuid"  # str: that device's UUID, the same in every process that sees it
CUDA_NAME = "name"  # str: its model
CUDA_VISIBLE = "visible"  # str | None: the proc's CUDA_VISIBLE_DEVICES

# Memory a proc uses on its GPUs, in its status (proc_ops.STATUS) and its health tree node.
# In a proc's answer: what torch says, only where torch is imported and CUDA already
# initialised (a status never initialises CUDA): {CUDA_DEVICE, CUDA_NAME, USED_BYTES}.
STATUS_CUDA = "cuda_in_use"
USED_BYTES = "used_bytes"  # int: bytes torch's caching allocator holds on that device
# Added by the host agent from NVML (when nvidia-ml-py is importable): the proc's GPU
# memory by GPU, keyed by the GPU's UUID and by its NVML index (as a string), in bytes.
# In the health tree's proc node: GPU id (as CUDA_VISIBLE_DEVICES names it) -> bytes used.
GPU_USED_BYTES = "gpu_used_bytes"
