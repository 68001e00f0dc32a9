"""Slurm defaults from ``$MONARCH_NB_HOME/config.toml``, so the partition, account,
time limit and set-up lines of a site are written once, not at every start::

    [slurm]
    partition = "gpu"
    account = "my-project"
    time = "4:00:00"
    mem = "64G"
    setup = ["module load cuda/12.4", "source ~/venvs/train/bin/activate"]

Keys are :class:`~.slurm.SlurmAllocator`'s argument names. The names dask-jobqueue's
``SLURMCluster`` and submitit's executor give the same settings are accepted too
(``queue``/``slurm_partition``, ``walltime``, ``memory``, ``job_script_prologue``/
``slurm_setup``, ``job_extra_directives``), so a site's existing settings carry over.
Arguments given to ``SlurmAllocator`` (or on the command line) win over the file.
"""

from __future__ import annotations

from typing import Any

from .. import config

KEYS = ("partition", "time", "mem", "gpus_per_node", "cpus_per_task", "account", "qos", "setup",
        "extra_sbatch_args", "start_timeout", "bind", "job_name")
ALIASES = {"queue": "partition", "slurm_partition": "partition", "walltime": "time", "memory": "mem",
           "job_script_prologue": "setup", "slurm_setup": "setup", "job_extra_directives": "extra_sbatch_args"}


def defaults() -> dict[str, Any]:
    """The ``[slurm]`` table of the config file, keys translated to ``SlurmAllocator``'s;
    ``{}`` when there is no file. Raises ``ValueError`` naming the file for TOML it
    can't read, a key it doesn't know, or one setting given under two names."""
    found: dict[str, Any] = {}
    for key, value in config.table("slurm").items():
        name = ALIASES.get(key, key)
        if name not in KEYS:
            raise ValueError(f"{config.path()}: [slurm] has no setting {key!r}; known: {', '.join(KEYS)} "
                             f"(or {', '.join(ALIASES)})")
        if name in found:
            raise ValueError(f"{config.path()}: [slurm] sets {name!r} twice (as {key!r} too)")
        found[name] = value
    return found
