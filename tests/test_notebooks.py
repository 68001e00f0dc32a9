"""Example notebooks run top to bottom in a real kernel (nbclient), as in CI's main job."""

from __future__ import annotations

from pathlib import Path

import nbformat

from monarch_nb.cli import run_notebook

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _text_outputs(nb) -> str:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") or "".join(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


def test_quickstart_runs_and_trains_above_threshold(tmp_path):
    executed = run_notebook(NOTEBOOKS / "quickstart.ipynb", tmp_path / "quickstart.executed.ipynb", timeout=300)
    nb = nbformat.read(executed, as_version=4)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    text = _text_outputs(nb)
    assert "accuracy" in text.lower()
    assert "ValueError" in text  # the caught remote exception is shown


def test_magics_notebook_runs_in_the_monarch_kernel(tmp_path):
    executed = run_notebook(NOTEBOOKS / "magics.ipynb", tmp_path / "magics.executed.ipynb", timeout=300)
    nb = nbformat.read(executed, as_version=4)
    assert nb.metadata.kernelspec.name == "monarch"
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    text = _text_outputs(nb)
    assert "[trainers 0-3] epoch 0 done" in text  # folded, under the calling cell
    assert "[workers.exec 0-3] hello from exec" in text
    assert "monarch: cluster 'magics-demo' stopped" in text


def test_debugging_notebook_pauses_inspects_and_continues_ranks(tmp_path):
    executed = run_notebook(NOTEBOOKS / "debugging.ipynb", tmp_path / "debugging.executed.ipynb", timeout=300)
    nb = nbformat.read(executed, as_version=4)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    text = _text_outputs(nb)
    assert "4 paused" in text and "4/4 procs healthy · 4 paused" in text
    assert "self.weight -= self.lr * loss" in text  # `where` shows the cell's own source
    assert "[trainers 0] 0.3\n[trainers 1] 0.4" in text and "[trainers 0-3] 1.0" in text  # side by side, folded
    assert "[('trainers', 2, 'update', 20)]" in text and "[trainers 2] 0.03" in text  # conditional, rank 2 only
    assert '"request": "attach"' in text
    assert "exception (ValueError: batch 5 has no labels)" in text and "ActorError - batch 5 has no labels" in text
    assert "monarch: cluster 'debug-demo' stopped" in text
