"""Monarch's ``BootstrapCommand`` for ``spawn_procs(bootstrap_command=...)``: how each
proc of a new mesh is started, of which monarch_nb honours the interpreter and the
environment (a proc is always ``python -m monarch_nb.proc``, forked from its host
agent's warm forkserver when it can be).

    cmd = default_bootstrap_cmd().with_env({"NCCL_DEBUG": "INFO"})
    procs = hosts.spawn_procs(per_host={"gpus": 2}, bootstrap_command=cmd)
    # or one per rank, from the proc's point in the new mesh:
    procs = hosts.spawn_procs(per_host={"gpus": 2}, bootstrap_command=lambda point:
                              default_bootstrap_cmd().with_env({"SHARD": str(point["gpus"])}))
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Union

from ..mesh import Extent, Point

PROC_ARGS = ("-m", "monarch_nb.proc")  # what every proc runs
# The interpreter a proc was started with (``with_python_executable``), so that procs it
# spawns in turn run it too: a wrapper script execs Python, whose sys.executable hides it.
PYTHON_ENV = "MONARCH_NB_PYTHON"


class BootstrapCommand:
    """A proc's start: ``program`` (the Python interpreter, a path on every host),
    ``arg0`` (``None``), ``args`` (``["-m", "monarch_nb.proc"]``) and ``env`` (str ->
    str, set in the proc over what it inherits, and over its GPU binding). Values:
    :meth:`with_env` returns a changed copy."""

    def __init__(self, program: str, arg0: str | None, args: list[str], env: Mapping[str, str]):
        if not isinstance(program, str) or not program:
            raise TypeError(f"BootstrapCommand's program is an interpreter path, not {program!r}")
        self.program = program
        self.arg0 = arg0
        self.args = list(args)
        self.env = _checked_env(env)

    def with_env(self, env: Mapping[str, str]) -> "BootstrapCommand":
        """A copy whose environment is this one's with ``env`` over it; this one is unchanged."""
        return BootstrapCommand(self.program, self.arg0, self.args, {**self.env, **_checked_env(env)})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BootstrapCommand) and vars(self) == vars(other)

    def __repr__(self) -> str:
        return f"BootstrapCommand(program={self.program!r}, arg0={self.arg0!r}, args={self.args!r}, env={self.env!r})"


PerRank = Union[BootstrapCommand, Callable[[Point], BootstrapCommand]]


def default_bootstrap_cmd() -> BootstrapCommand:
    """How procs start by default: this process's interpreter (or the one it was itself
    started with by ``with_python_executable``), ``-m monarch_nb.proc``, no extra
    environment."""
    return BootstrapCommand(os.environ.get(PYTHON_ENV) or sys.executable, None, list(PROC_ARGS), {})


def _checked_env(env: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise TypeError(f"a bootstrap command's env maps variable names to strings, not {env!r}")
    return dict(env)


def per_rank(command: PerRank, extent: Extent) -> tuple[str, list[dict[str, str]]]:
    """The interpreter and each proc's environment (in rank order) of a mesh over
    ``extent`` spawned with ``bootstrap_command=command`` (one command for every proc,
    or a function of the proc's :class:`Point` in the new mesh). Raises ``TypeError``
    for anything else, ``NotImplementedError`` for what procs here cannot vary: an
    ``arg0``, other arguments, or interpreters that differ between procs."""
    if isinstance(command, BootstrapCommand):
        commands = [command] * extent.nelements
    elif callable(command):
        commands = [command(point) for point in extent.points()]
        wrong = [c for c in commands if not isinstance(c, BootstrapCommand)]
        if wrong:
            raise TypeError(f"bootstrap_command's function returned {wrong[0]!r}, not a BootstrapCommand; "
                            "start from default_bootstrap_cmd()")
    else:
        raise TypeError(f"bootstrap_command takes a BootstrapCommand or a function of a Point returning one, "
                        f"not {command!r}")
    for c in commands:
        if c.arg0 is not None or tuple(c.args) != PROC_ARGS:
            raise NotImplementedError(
                f"monarch_nb has no spawn_procs(bootstrap_command=) with arg0={c.arg0!r}, args={c.args!r}: a proc is "
                f"always `python {' '.join(PROC_ARGS)}`; change only the program (an interpreter) and env of "
                "default_bootstrap_cmd(), or pass bootstrap= to run set-up code in each proc")
    programs = sorted({c.program for c in commands})
    if len(programs) > 1:
        raise NotImplementedError(f"monarch_nb has no spawn_procs(bootstrap_command=) whose procs run different "
                                  f"interpreters ({programs}); spawn one proc mesh per interpreter")
    return programs[0], [c.env for c in commands]
