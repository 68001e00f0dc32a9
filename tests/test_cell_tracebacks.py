"""What the notebook shows for monarch_nb's errors, without a kernel: a failure shown
under the cell is not said again by the error the cell's call raises, and cells are
named as IPython names them (``Cell In[12], line 5``), not by their hashed file names."""

from __future__ import annotations

from types import SimpleNamespace

from IPython.core.compilerop import CachingCompiler

from monarch_nb.errors import ActorError, MeshFailure, SupervisionError
from monarch_nb.notebook.cell_names import CellNames
from monarch_nb.notebook.cells import CellLogs

WHY = "proc victims/0 (pid 20556 on vm) killed by SIGKILL (by a person or program)"


def _shell():
    compiler = CachingCompiler()
    compiler._filename_map["/tmp/ipykernel_77/1693277300.py"] = 12
    return SimpleNamespace(compile=compiler)


def test_a_failure_noticed_between_cells_is_not_repeated_by_the_next_cells_error():
    cells = CellLogs(_shell())
    cells.on_failure("cluster-x", MeshFailure("proc_failed", (), (), WHY, "victims", 0), None)
    assert cells.queued and not cells.said  # between cells: for the next one
    cells.pre_run_cell()
    error = SupervisionError(f"Endpoint call victim.pid() failed, The actor ... have failed:\n"
                             f"  victim rank 0: the process failed: Killed(sig=9); {WHY}\n"
                             "To recover: restart() on actor mesh 'victim'")
    stb = ["Traceback (most recent call last):", f"SupervisionError: {error}"]
    shown = "\n".join(cells.traceback(error, stb))
    assert WHY not in shown and "Killed(sig=9); the failure shown above" in shown and "To recover: " in shown
    cells.running = False
    cells.pre_run_cell()  # a later cell: its error says all again
    assert WHY in "\n".join(cells.traceback(error, stb))


def test_errors_name_cells_as_ipython_does():
    cells = CellLogs(_shell())
    failure = ActorError("w", "compute", [SimpleNamespace(point=0, exception=ValueError("x"), traceback=(
        'Traceback (most recent call last):\n  File "/tmp/ipykernel_77/1693277300.py", line 5, in compute\n'
        '  File "/tmp/ipykernel_31/1693277300.py", line 6, in compute\n'
        '  File "/tmp/ipykernel_31/999.py", line 7, in helper\n'
        '  File "/work/train.py", line 8, in step\nValueError: x'))], 1)
    shown = "\n".join(cells.traceback(failure, [str(failure)]))
    assert "Cell In[12], line 5, in compute" in shown
    assert "Cell In[12], line 6, in compute" in shown  # an earlier kernel's, of the same text
    assert "Cell of an earlier kernel, line 7, in helper" in shown
    assert 'File "/work/train.py", line 8, in step' in shown and "ipykernel_" not in shown
    assert cells.traceback(ValueError("x"), ['File "/tmp/ipykernel_77/1693277300.py"']) == [
        'File "/tmp/ipykernel_77/1693277300.py"']  # not ours: IPython's own way


def test_the_paused_list_names_cells_too():
    names = CellNames(_shell())
    assert names.where("/tmp/ipykernel_77/1693277300.py", 5) == "Cell In[12], line 5"
    assert names.where("/work/train.py", 8) == "train.py:8"
    assert names.where(None, None) == "?:None"
