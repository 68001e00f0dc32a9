"""Allocators get hosts and start a host agent on each: local subprocesses, a Slurm
batch job, or commands such as ``ssh`` or ``ip netns exec``. The protocol they share
and the factory the hub uses are in :mod:`.base`."""
