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
