"""Fault tolerance at training scale (issue 27): replica groups that recover while the
others keep stepping, and fault injection to show and test it.

    from monarch_nb.ft import ReplicaGroups, inject_fault
"""

from ..proc.faults import InjectedFault
from .faults import FAULTS, inject_fault
from .replica_groups import GroupState, ReplicaGroup, ReplicaGroups
from .step_loops import StepLoops
from .torchft_quorum import TorchFTLighthouse

__all__ = ["FAULTS", "GroupState", "InjectedFault", "ReplicaGroup", "ReplicaGroups", "StepLoops", "TorchFTLighthouse", "inject_fault"]
