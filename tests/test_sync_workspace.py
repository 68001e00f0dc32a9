"""ProcMesh.sync_workspace: a change to the client's source reaches running procs; live
actors continue with the new code and their state; what can't be reloaded is said."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from monarch_nb.proc import workspace
from monarch_nb.client.workspace_sync import workspace_files

BOUND_S = 60

MODULE_V1 = '''
from monarch_nb.actor import Actor, endpoint

def scale(x):
    return x * 2

class Trainer(Actor):
    def __init__(self):
        self.calls = 0

    @endpoint
    def step(self, x):
        self.calls += 1
        return scale(x), self.calls
'''


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text().replace(old, new)
    path.write_text(text)
    later = time.time() + 1  # a later mtime than the procs' start, whatever the clock's grain
    os.utime(path, (later, later))


@pytest.fixture
def workspace_dir(tmp_path, monkeypatch):
    root = tmp_path / "ws"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text(MODULE_V1)
    (root / ".venv").mkdir()
    (root / ".venv" / "skip.py").write_text("")
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root))
    for name in ("pkg", "pkg.model"):  # another test's workspace had a pkg too
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield root


def test_a_changed_function_reaches_live_actors_which_keep_their_state(cluster, workspace_dir):
    from pkg.model import Trainer
    procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 2})
    try:
        trainers = procs.spawn("t", Trainer)
        assert trainers.step.call(3).get(timeout=BOUND_S).values() == [(6, 1), (6, 1)]
        _edit(workspace_dir / "pkg" / "model.py", "return x * 2", "return x * 10")
        result = procs.sync_workspace()
        assert result["files"] == 2 and result["sent"] == {}  # one host: the procs read the same files
        assert result["reloaded"] == ["pkg.model"] and result["swapped"] == ["t"] and not result["problems"]
        assert trainers.step.call(3).get(timeout=BOUND_S).values() == [(30, 2), (30, 2)]
        assert procs.sync_workspace()["reloaded"] == []  # nothing changed since
    finally:
        procs.stop()


def test_what_cannot_be_reloaded_is_said_and_keeps_its_old_code(cluster, workspace_dir):
    from pkg.model import Trainer
    procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 1})
    try:
        trainers = procs.spawn("t", Trainer)
        _edit(workspace_dir / "pkg" / "model.py", "class Trainer(Actor):", "class Renamed(Actor):")
        result = procs.sync_workspace()
        assert result["swapped"] == []
        assert any("class Trainer is gone from pkg.model" in p for p in result["problems"]), result
        assert trainers.step.call_one(1).get(timeout=BOUND_S) == (2, 1)  # the old code runs on
        _edit(workspace_dir / "pkg" / "model.py", "def scale(x):", "def scale(x) oops:")
        result = procs.sync_workspace()
        assert any("pkg.model failed to reload" in p and "SyntaxError" in p for p in result["problems"]), result
        assert trainers.step.call_one(1).get(timeout=BOUND_S) == (2, 2)
    finally:
        procs.stop()


# -- without processes: what a proc on another host does with the files --------------------

def test_a_proc_elsewhere_gets_exactly_the_files_it_lacks_and_nothing_outside_the_workspace(tmp_path):
    client, proc = tmp_path / "client", tmp_path / "proc"
    (client / "a").mkdir(parents=True)
    (client / "a" / "x.py").write_text("X = 1\n")
    (client / "y.py").write_text("Y = 1\n")
    (client / "__pycache__").mkdir()
    (client / "__pycache__" / "z.py").write_text("")
    files = workspace_files(client)
    assert sorted(files) == ["a/x.py", "y.py"]
    digests = {rel: workspace.digest(data) for rel, data in files.items()}
    proc.mkdir()
    (proc / "y.py").write_text("Y = 1\n")
    assert workspace.needed(proc, digests) == ["a/x.py"]
    workspace.write(proc, {"a/x.py": files["a/x.py"]})
    assert workspace.needed(proc, digests) == []
    for bad in ("../escape.py", "a/x.txt", "/etc/passwd.py"):
        with pytest.raises(ValueError, match="not a .py file inside the workspace"):
            workspace.write(proc, {bad: b""})
    assert not (tmp_path / "escape.py").exists()
