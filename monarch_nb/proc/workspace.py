"""A proc's side of ``ProcMesh.sync_workspace`` (Monarch's name): bring this proc's copy
of the client's workspace (its ``.py`` files) up to date, reload the modules whose files
changed, and move live actors onto their reloaded classes.

What a reload can't reach is reported, not hidden: a module that fails to import again
(the proc keeps the old one), and an actor whose class is gone from its reloaded module
or can't take the new class (a changed ``__slots__`` layout) keeps its old code."""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 16 << 20  # a .py file larger than this is not a workspace's source


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Synced:
    """Which workspace files changed since this proc's modules were loaded from them:
    before the first sync, those modified after the proc started; then those whose
    digest differs from the last sync's."""

    def __init__(self):
        self._digests: dict[str, str] | None = None
        self._started = time.time()

    def changed(self, root: Path, digests: dict[str, str]) -> set[str]:
        """The changed files of ``digests`` (the workspace now); remembers them."""
        if self._digests is None:
            out = set()
            for rel in digests:
                try:
                    if (root / rel).stat().st_mtime > self._started:
                        out.add(rel)
                except OSError:
                    pass
        else:
            out = {rel for rel, d in digests.items() if self._digests.get(rel) != d}
        self._digests = dict(digests)
        return out


def local_digests(root: Path, paths: list[str]) -> dict[str, str | None]:
    """The digest of each of ``paths`` (relative to ``root``) here; ``None`` if missing."""
    out: dict[str, str | None] = {}
    for rel in paths:
        try:
            out[rel] = digest((root / rel).read_bytes())
        except OSError:
            out[rel] = None
    return out


def needed(root: Path, wanted: dict[str, str]) -> list[str]:
    """Of ``wanted`` (relative path -> digest), the files this proc's copy lacks or holds
    otherwise. Raises ``ValueError`` for a path that leaves ``root``."""
    for rel in wanted:
        _inside(root, rel)
    here = local_digests(root, list(wanted))
    return sorted(rel for rel, d in wanted.items() if here[rel] != d)


def write(root: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` (relative path -> contents) under ``root``, each atomically."""
    for rel, data in files.items():
        path = _inside(root, rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def _inside(root: Path, rel: str) -> Path:
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()) or not rel.endswith(".py"):
        raise ValueError(f"sync_workspace: {rel!r} is not a .py file inside the workspace {root}")
    return path


def reload_changed(root: Path, changed: set[str], actors: list) -> dict:
    """Reload the imported modules whose files (relative to ``root``) are in ``changed``,
    then give each of ``actors`` (``ActorThread``) whose class lived in one of them the
    reloaded class. Returns ``{"reloaded": [module], "swapped": [mesh], "problems":
    [text]}``."""
    base = root.resolve()
    by_file = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and file.endswith(".py"):
            try:
                rel = str(Path(file).resolve().relative_to(base))
            except ValueError:
                continue
            if rel in changed:
                by_file[name] = module
    reloaded, problems = [], []
    importlib.invalidate_caches()
    for name, module in sorted(by_file.items()):
        try:
            importlib.reload(module)
            reloaded.append(name)
        except Exception as e:  # noqa: BLE001 - the old module stays; the user is told
            problems.append(f"module {name} failed to reload and keeps its old code: {type(e).__name__}: {e}")
    swapped: list[str] = []
    for actor in actors:
        instance = actor.instance
        cls = type(instance) if instance is not None else None
        if cls is None or cls.__module__ not in reloaded:
            continue
        new: Any = sys.modules[cls.__module__]
        for part in cls.__qualname__.split("."):
            new = getattr(new, part, None)
        if not isinstance(new, type) or new is cls:  # (reload leaves names the new code no longer defines)
            problems.append(f"actor mesh {actor.mesh_name}: its class {cls.__qualname__} is gone from "
                            f"{cls.__module__}; it keeps its old code (spawn it again)")
            continue
        try:
            instance.__class__ = new
        except TypeError as e:
            problems.append(f"actor mesh {actor.mesh_name}: can't take the new {cls.__qualname__} ({e}); it "
                            f"keeps its old code (spawn it again)")
            continue
        actor.actor_class = new
        swapped.append(actor.mesh_name)
    return {"reloaded": reloaded, "swapped": sorted(set(swapped)), "problems": problems}
