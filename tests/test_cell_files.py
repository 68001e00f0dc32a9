"""Cell files that procs write for the debugger (``/tmp/ipykernel_PID/HASH.py``) go
with the cluster, and nothing monarch_nb did not create goes with them."""

from __future__ import annotations

import linecache
import os
import shutil
import tempfile
import textwrap
import time

import pytest

from monarch_nb.debug import arming
from monarch_nb.proc import cell_files

from conftest import cluster_processes, wait_until

CELL = "x = 1\n"


@pytest.fixture
def folders():
    """Two cell folders of kernels that do not exist (pids no one has)."""
    made = [os.path.join(tempfile.gettempdir(), f"ipykernel_cf{os.getpid()}_{time.monotonic_ns()}_{i}")
            for i in range(2)]
    yield made
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_sweep_removes_what_procs_wrote_and_leaves_the_rest(folders, tmp_path, monkeypatch):
    record = tmp_path / "host0.jsonl"
    monkeypatch.setenv(cell_files.RECORD_ENV, str(record))
    ours, kernels = folders
    os.mkdir(kernels, 0o700)  # the kernel's own folder, with a file of its own (ipykernel's debugger)
    with open(os.path.join(kernels, "1.py"), "w") as f:
        f.write(CELL)
    arming.materialize(os.path.join(ours, "2.py"), CELL)  # folder and file made here
    arming.materialize(os.path.join(kernels, "3.py"), CELL)  # the file only
    arming.materialize(os.path.join(kernels, "1.py"), "other = 2\n")  # there already: not ours
    arming.materialize(os.path.join(kernels, "4.py"), CELL)
    os.unlink(os.path.join(kernels, "4.py"))  # replaced since by someone else's file of that name
    with open(os.path.join(kernels, "4.py"), "w") as f:
        f.write("theirs = 3\n")
    with open(record, "a") as f:
        f.write('{"folder": "/tmp", "dev"')  # a proc killed while noting a file
    assert cell_files.sweep(record) == 3
    assert not os.path.exists(ours)
    assert sorted(os.listdir(kernels)) == ["1.py", "4.py"]
    assert open(os.path.join(kernels, "1.py")).read() == CELL
    assert not record.exists()
    assert cell_files.sweep(record) == 0  # nothing recorded: nothing to do


def test_nothing_is_removed_from_a_folder_others_may_write(folders, tmp_path, monkeypatch, capfd):
    record = tmp_path / "host0.jsonl"
    monkeypatch.setenv(cell_files.RECORD_ENV, str(record))
    arming.materialize(os.path.join(folders[0], "2.py"), CELL)
    os.chmod(folders[0], 0o777)  # as if opened to others since: what is in it may not be ours any more
    assert cell_files.sweep(record) == 0
    assert os.listdir(folders[0]) == ["2.py"]
    assert "may be written by other users" in capfd.readouterr().err


def test_a_proc_outside_a_host_agent_records_nothing(folders, monkeypatch):
    monkeypatch.delenv(cell_files.RECORD_ENV, raising=False)
    arming.materialize(os.path.join(folders[0], "2.py"), CELL)
    assert os.listdir(folders[0]) == ["2.py"]


WORKER = textwrap.dedent("""\
    from monarch_nb.actor import Actor, endpoint

    class CellWorker(Actor):
        @endpoint
        def compute(self, x):
            y = x + 1
            return y
    """)


def _cell(folder: str, name: str) -> type:
    """A class defined as a notebook cell defines it: compiled under the cell's file name,
    its text only in linecache (no file), in a module procs can't import (so it is
    pickled by value)."""
    path = os.path.join(folder, name)
    linecache.cache[path] = (len(WORKER), None, WORKER.splitlines(True), path)
    namespace = {"__name__": f"cell_{os.getpid()}"}
    exec(compile(WORKER, path, "exec"), namespace)
    return namespace["CellWorker"]


def test_cell_files_procs_wrote_go_when_the_cluster_stops(folders):
    from monarch_nb.client.cluster import Cluster

    ours, kernels = folders
    os.mkdir(kernels, 0o700)
    with open(os.path.join(kernels, "1.py"), "w") as f:
        f.write(CELL)
    cluster = Cluster.start_ephemeral()
    try:
        procs = cluster.this_host().spawn_procs(per_host={"gpus": 2}, name="cellprocs")
        for i, folder in enumerate(folders):
            cls = _cell(folder, f"{100 + i}.py")
            procs.spawn(f"cells{i}", cls)
            bp = cluster.debugger.set_breakpoint(cls.compute, mesh=f"cells{i}")
            assert len(bp["bound"]) == 2
            assert os.path.exists(os.path.join(folder, f"{100 + i}.py"))  # written by the procs
            cluster.debugger.clear_breakpoints()
    finally:
        cluster.stop()
    assert wait_until(lambda: not cluster_processes(cluster.path), 30)
    assert not os.path.exists(ours)  # made by a proc: gone with its files
    assert os.listdir(kernels) == ["1.py"]  # the kernel's folder and its own file stay
