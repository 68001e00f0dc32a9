"""The client's side of ``ProcMesh.sync_workspace``: the ``.py`` files of the client's
workspace (its working directory), sent to the procs whose copy differs, and the changed
modules reloaded in every proc (``proc.workspace``)."""

from __future__ import annotations

import os
from pathlib import Path

from ..protocol import envelope, proc_ops
from ..proc.workspace import MAX_FILE_BYTES, digest
from . import proc_ask

# Folders that hold no workspace source: caches, environments, builds, VCS data.
SKIPPED_DIRS = {"__pycache__", "node_modules", "build", "dist", "site-packages"}
MAX_FILES = 10_000
TIMEOUT_S = 60.0


def workspace_files(root: Path) -> dict[str, bytes]:
    """The ``.py`` files under ``root`` by path relative to it, leaving out hidden folders,
    virtual environments (a folder with a ``pyvenv.cfg``) and ``SKIPPED_DIRS``. Raises
    ``ValueError`` past ``MAX_FILES`` files or for a file over ``MAX_FILE_BYTES``."""
    found: dict[str, bytes] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS
                         and not (Path(folder) / d / "pyvenv.cfg").exists())
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = Path(folder) / name
            if path.stat().st_size > MAX_FILE_BYTES:
                raise ValueError(f"sync_workspace: {path} is over {MAX_FILE_BYTES >> 20} MiB; a workspace's "
                                 "source files are smaller: run it from the folder of your code")
            found[str(path.relative_to(root))] = path.read_bytes()
            if len(found) > MAX_FILES:
                raise ValueError(f"sync_workspace: over {MAX_FILES} .py files under {root}; run it from the "
                                 "folder of your code, not a parent of many projects")
    return found


def sync(mesh, reload: bool, timeout: float) -> dict:
    """See ``ProcMesh.sync_workspace``."""
    root = Path.cwd()
    files = workspace_files(root)
    digests = {rel: digest(data) for rel, data in files.items()}
    why = "every proc of the mesh runs the workspace's code"
    ranks = len(mesh)
    needs = proc_ask.ask(mesh, [{envelope.OP: proc_ops.SYNC_WORKSPACE, proc_ops.DIGESTS: digests}] * ranks,
                         timeout, why)
    _raise_refused(needs)
    sent = {rank: reply[proc_ops.NEED] for rank, reply in enumerate(needs) if reply[proc_ops.NEED]}
    headers = [{envelope.OP: proc_ops.SYNC_WORKSPACE, proc_ops.DIGESTS: digests, proc_ops.RELOAD: reload,
                proc_ops.FILES: {rel: files[rel] for rel in sent.get(rank, ())}} for rank in range(ranks)]
    replies = proc_ask.ask(mesh, headers, timeout, why)
    _raise_refused(replies)
    results = [reply[proc_ops.RESULT] for reply in replies]
    return {"files": len(files), "sent": sent,
            "reloaded": sorted({m for r in results for m in r["reloaded"]}),
            "swapped": sorted({m for r in results for m in r["swapped"]}),
            "problems": sorted({p for r in results for p in r["problems"]})}


def _raise_refused(replies: list[dict]) -> None:
    """``ValueError`` with what a proc refused (a path outside its workspace, a file it
    could not write), naming the rank; the procs carry on."""
    refused = [f"rank {rank}: {reply[envelope.ERROR]}" for rank, reply in enumerate(replies) if envelope.ERROR in reply]
    if refused:
        raise ValueError("sync_workspace: " + "; ".join(refused))
