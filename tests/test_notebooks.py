"""Example notebooks run top to bottom in a real kernel (nbclient), as in CI's main job."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from nbclient.exceptions import CellTimeoutError

from monarch_nb.cli import run_notebook

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _text_outputs(nb) -> str:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") or "".join(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


def _run_without_errors(name: str, tmp_path) -> tuple:
    """Execute notebooks/NAME.ipynb; returns it executed and its text outputs, after
    checking that no cell raised."""
    executed = run_notebook(NOTEBOOKS / f"{name}.ipynb", tmp_path / f"{name}.executed.ipynb", timeout=300)
    nb = nbformat.read(executed, as_version=4)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    return nb, _text_outputs(nb)


def test_every_example_notebook_opens_on_the_monarch_kernel():
    # JupyterLab picks a notebook's kernel from its metadata: on python3 the examples
    # opened without the magics and progress bars (issue 23).
    kernels = {path.name: nbformat.read(path, as_version=4).metadata.kernelspec.name
               for path in NOTEBOOKS.glob("*.ipynb") if not path.name.endswith(".executed.ipynb")}
    assert kernels and set(kernels.values()) == {"monarch"}, kernels


def test_quickstart_runs_and_trains_above_threshold(tmp_path):
    nb, text = _run_without_errors("quickstart", tmp_path)
    assert "accuracy" in text.lower()
    assert "ValueError" in text  # the caught remote exception is shown
    assert "killed by SIGKILL" in text and "restarted ranks: [5]" in text and "hello, again! from gpu 5" in text


def test_magics_notebook_runs_in_the_monarch_kernel(tmp_path):
    nb, text = _run_without_errors("magics", tmp_path)
    assert nb.metadata.kernelspec.name == "monarch"
    assert "[trainers 0-3] epoch 0 done" in text  # folded, under the calling cell
    assert "[workers.exec 0-3] hello from exec" in text, [line for line in text.splitlines() if "exec" in line]
    assert "monarch: cluster 'magics-demo' stopped" in text


def test_debugging_notebook_pauses_inspects_and_continues_ranks(tmp_path):
    nb, text = _run_without_errors("debugging", tmp_path)
    assert "4 paused" in text and "4/4 procs healthy · 4 paused" in text
    assert "self.weight -= self.lr * loss" in text  # `where` shows the cell's own source
    assert "[trainers 0] 0.3\n[trainers 1] 0.4" in text and "[trainers 0-3] 1.0" in text  # side by side, folded
    assert "[('trainers', 2, 'update', 20)]" in text and "[trainers 2] 0.03" in text  # conditional, rank 2 only
    assert '"request": "attach"' in text
    assert "exception (ValueError: batch 5 has no labels)" in text and "ActorError - batch 5 has no labels" in text
    assert "monarch: cluster 'debug-demo' stopped" in text


def test_a_monarch_program_runs_with_only_its_imports_changed(tmp_path):
    nb, text = _run_without_errors("from_monarch", tmp_path)
    assert "[12, 12, 11, 11]" in text and "rank 3 of {'gpus': 4}, called at {} of {}" in text  # broadcast, slicing
    assert "[(1, 0), (1, 1), (1, 2)]" in text  # a port passed to an actor
    assert "caught ZeroDivisionError" in text and "actor died: True" in text and "later calls fail too" in text
    assert "['worker 0', 'worker 1', 'worker 2', 'worker 3']" in text  # one controller for all
    assert "Traceback" not in text.replace("[fragile 2] Traceback", "")  # only the dead actor's


def test_running_a_notebook_leaves_no_folder_behind(tmp_path, monkeypatch):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    nbformat.write(notebook, tmp_path / "tiny.ipynb")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where run_notebook's folders go
    (tmp_path / "tmp").mkdir()
    executed = run_notebook(tmp_path / "tiny.ipynb", tmp_path / "tiny.executed.ipynb", timeout=120)
    assert "42" in _text_outputs(nbformat.read(executed, as_version=4))
    assert not list((tmp_path / "tmp").iterdir())


def test_a_failed_run_names_the_retained_cluster_it_left_running(tmp_path):
    import subprocess
    import sys

    import monarch_nb

    cells = ["import monarch_nb\ncluster = monarch_nb.Cluster.start('left-by-run')",
             "raise RuntimeError('a cell failed')", "cluster.stop()"]
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]),
                   tmp_path / "leaves.ipynb")
    try:
        done = subprocess.run([sys.executable, "-m", "monarch_nb.cli", "run", str(tmp_path / "leaves.ipynb")],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 1 and "a cell failed" in done.stderr, done.stderr
        assert "left retained cluster 'left-by-run' running" in done.stderr, done.stderr
        assert "monarch-nb cluster stop left-by-run" in done.stderr
    finally:
        monarch_nb.connect("left-by-run").stop()


def test_a_cell_running_past_the_timeout_fails_the_run_in_time(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time; time.sleep(120)")])
    nbformat.write(notebook, tmp_path / "slow.ipynb")
    started = time.monotonic()
    with pytest.raises(CellTimeoutError):
        run_notebook(tmp_path / "slow.ipynb", tmp_path / "slow.executed.ipynb", timeout=3)
    # Not the cell's 120 s: the run stops at the timeout (kernel start and shutdown aside).
    assert time.monotonic() - started < 90


def test_weight_sync_notebook_pulls_256_mib_with_rdma_and_plots(tmp_path):
    nb, text = _run_without_errors("weight_sync", tmp_path)
    assert "published 256 MiB of weights to 2 generators" in text
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert "was dropped by its owner" in text
