"""Allocators get hosts and start a host agent on each: local subprocesses (here),
Slurm (later). They all offer ``start(hub_address, hosts)`` and ``stop(timeout)``."""
