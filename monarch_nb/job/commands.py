"""``exec_command``: run a command line on every host of a host mesh (Monarch's
``monarch.job.exec_command``).

    rc = exec_command(state.workers, ["nvidia-smi"]).get()          # max return code
    exec_command(hosts, ["train.py", "--lr", "0.1"], per_host={"gpus": 8}).get()

It spawns a proc mesh on ``host_mesh`` (``per_host`` as for ``spawn_procs``), a
:class:`BashActor` on each proc, runs the command there and stops the procs again, also
when the command's call fails. A command whose first word ends in ``.py`` (or is ``-m``)
runs with the proc's Python interpreter; any other runs as a bash script (``env`` exported,
``cd`` to ``workdir``, else to the client's working directory where the host has it).
"""

from __future__ import annotations

import os
import secrets
import shlex
import subprocess
import sys
import tempfile
from typing import Any

from ..client.endpoint import endpoint
from ..client.future import Future
from ..proc.actor import Actor

__all__ = ["BashActor", "exec_command"]


def _finished(proc: subprocess.CompletedProcess, output_dir: str | None) -> dict:
    return {"returncode": proc.returncode,
            "stdout": "" if output_dir is not None else proc.stdout,
            "stderr": "" if output_dir is not None else proc.stderr}


def _run(argv: list[str], output_dir: str | None, **kwargs: Any) -> dict:
    """Run ``argv``; its output captured, or written to ``output_dir``'s ``stdout.txt`` and
    ``stderr.txt`` (the folder made if needed)."""
    if output_dir is None:
        return _finished(subprocess.run(argv, capture_output=True, text=True, **kwargs), None)
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "stdout.txt"), "w") as out, \
            open(os.path.join(output_dir, "stderr.txt"), "w") as err:
        return _finished(subprocess.run(argv, stdout=out, stderr=err, text=True, **kwargs), output_dir)


class BashActor(Actor):
    """Runs a command on its proc's host. Each endpoint returns
    ``{"returncode": int, "stdout": str, "stderr": str}`` (the streams empty when they
    went to ``output_dir``)."""

    @endpoint
    def run(self, script: str, output_dir: str | None = None) -> dict:
        """Run ``script`` (a bash script's text)."""
        with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
            f.write(script)
        try:
            return _run(["bash", f.name], output_dir)
        finally:
            os.unlink(f.name)

    @endpoint
    def run_python(self, cmd: list[str], env: dict[str, str] | None = None, workdir: str | None = None,
                   client_cwd: str | None = None, output_dir: str | None = None) -> dict:
        """Run ``python *cmd`` with this proc's interpreter, in ``workdir`` (else the
        client's working directory, where this host has it), ``env`` added."""
        cwd = workdir or (client_cwd if client_cwd and os.path.isdir(client_cwd) else None)
        return _run([sys.executable, *cmd], output_dir, cwd=cwd, env={**os.environ, **(env or {})})


def _script(cmd: list[str], env: dict[str, str] | None, workdir: str | None, client_cwd: str) -> str:
    lines = ["#!/bin/bash"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    if workdir:
        lines.append(f"cd {shlex.quote(workdir)}")
    else:
        lines.append(f"[ -d {shlex.quote(client_cwd)} ] && cd {shlex.quote(client_cwd)}")
    lines.append(shlex.join(cmd))
    return "\n".join(lines) + "\n"


def _selected(host_mesh: Any, rank: int | None, point: dict[str, int] | None) -> Any:
    if rank is not None and point is not None:
        raise ValueError("exec_command: give rank= or point=, not both")
    if point is not None:
        return host_mesh.slice(**point)
    if rank is None:
        return host_mesh
    flatten = getattr(host_mesh, "flatten", None)
    if flatten is None:
        raise NotImplementedError("monarch_nb has no HostMesh.flatten, which exec_command(rank=...) uses; "
                                  "select the host with point={...} instead")
    return flatten("rank").slice(rank=rank)


def _pairs(results: Any) -> list:
    """(rank key, result) pairs of what the endpoint's ``call`` gave."""
    return list(results.items()) if hasattr(results, "items") else list(results)


def exec_command(host_mesh: Any, cmd: list[str], env: dict[str, str] | None = None, workdir: str | None = None,
                 output_dir: str | None = None, rank: int | None = None, point: dict[str, int] | None = None,
                 per_host: dict[str, int] | None = None) -> Future[int]:
    """Run ``cmd`` (a command and its arguments) on ``host_mesh`` (or the host at
    ``point``, a coordinate dict; ``rank`` needs a host mesh with ``flatten``); a Future
    of the largest return code over the procs (0: all succeeded). Without ``output_dir``
    each proc's stdout and stderr are printed here when it ends; with it they go to
    ``stdout.txt`` / ``stderr.txt`` there, on each host.

    Raises ``ValueError`` for an empty ``cmd`` or both ``rank`` and ``point``; the
    Future raises what spawning or the call raised (the procs are stopped either way).
    """
    if not cmd:
        raise ValueError("exec_command: cmd is empty; give the command and its arguments as a list")
    hosts = _selected(host_mesh, rank, point)
    client_cwd = os.getcwd()

    async def run() -> int:
        procs = hosts.spawn_procs(per_host=per_host, name=f"exec_command_{secrets.token_hex(4)}")
        try:
            actors = procs.spawn("BashActor", BashActor)
            if cmd[0].endswith(".py") or cmd[0] == "-m":
                results = await actors.run_python.call(cmd, env=env, workdir=workdir, client_cwd=client_cwd,
                                                       output_dir=output_dir)
            else:
                results = await actors.run.call(_script(cmd, env, workdir, client_cwd), output_dir=output_dir)
            worst = 0
            for _, result in _pairs(results):
                worst = max(worst, result.get("returncode", 1))
                if output_dir is None:
                    print(result.get("stdout", ""), end="")
                    print(result.get("stderr", ""), end="", file=sys.stderr)
            return worst
        finally:
            await procs.stop()

    return Future._from_coro(run(), "exec_command")
