"""Fault tolerance at training scale (issue 27): fault injection to show and test
recovery. ``from monarch_nb.ft import inject_fault, InjectedFault``."""

from ..proc.faults import InjectedFault
from .faults import FAULTS, inject_fault

__all__ = ["FAULTS", "InjectedFault", "inject_fault"]
