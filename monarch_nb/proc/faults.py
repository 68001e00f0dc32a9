"""Faults a proc inflicts on itself when asked (``proc_ops.INJECT_FAULT``): what
``monarch_nb.ft.inject_fault`` uses to show and test recovery. Each is the real thing,
not a simulation: supervision, the hub and the caller see what they would see if the
fault had happened on its own."""

from __future__ import annotations

import ctypes
import os
import signal

import psutil

from ..protocol import proc_ops


class InjectedFault(RuntimeError):
    """Raised in the endpoints a proc was running when ``inject_fault(..., "exception")``
    reached it."""


def inflict(kind: str, agent_pid: int | None) -> None:
    """Inflict fault ``kind`` on this process: any of ``proc_ops.FAULT_KINDS`` but
    ``FAULT_EXCEPTION`` (which the proc's server raises in its busy actors, as it
    interrupts them). ``agent_pid`` (``FAULT_HOST``) is killed only if it is this proc's
    ancestor: a message naming any other process is ignored."""
    if kind == proc_ops.FAULT_KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == proc_ops.FAULT_SEGFAULT:
        ctypes.string_at(0)  # reads address 0 (faulthandler, if on, prints the stacks, then the proc dies)
    elif kind == proc_ops.FAULT_HANG:
        os.kill(os.getpid(), signal.SIGSTOP)  # every thread stops, as in a rank stuck in a driver call
    elif kind == proc_ops.FAULT_HOST:
        if agent_pid is not None and agent_pid in {p.pid for p in psutil.Process().parents()}:
            os.kill(agent_pid, signal.SIGKILL)
