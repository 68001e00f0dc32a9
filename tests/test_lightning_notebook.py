"""notebooks/lightning.ipynb runs top to bottom in a real kernel (as CI runs every example
notebook): an unchanged LightningModule is fitted by Trainer(strategy="ddp") in the 2 gloo
ranks of an actor mesh, and the metrics a Callback in the ranks sends reach the notebook
while the ranks train."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("lightning", reason="Lightning is not installed: pip install 'monarch_nb[lightning]'")

from test_notebooks import _run_without_errors  # noqa: E402 - after the skip: it imports nbformat


def test_lightning_notebook_trains_in_two_ddp_ranks_with_live_metrics(tmp_path):
    nb, text = _run_without_errors("lightning", tmp_path)
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in text  # one DDP world of 2 ranks
    assert "`Trainer.fit` stopped: `max_epochs=6` reached." in text
    # every epoch line printed by rank 0 reached the cell, tagged with mesh and rank
    assert [int(e) for e in re.findall(r"\[lightning 0\] epoch (\d+): step", text)] == list(range(6)), text
    live = re.search(r"(\d+) live updates \((\d+) step, (\d+) epoch\) reached the notebook", text)
    assert live and int(live[3]) == 6 and int(live[2]) >= 20, text  # every epoch's, and steps every 5 of 144
    accuracy = float(re.search(r"val_acc on both ranks: ([\d.]+)", text)[1])  # one value: DDP kept them equal
    assert accuracy > 0.8, accuracy
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the curves


def _notebook_cells(*marks: str) -> str:
    """The code of the notebook's cells that contain one of ``marks``, in order."""
    import nbformat

    from test_notebooks import NOTEBOOKS

    nb = nbformat.read(NOTEBOOKS / "lightning.ipynb", as_version=4)
    return "\n\n".join(c.source for c in nb.cells if c.cell_type == "code" and any(m in c.source for m in marks))


@pytest.fixture
def retained():
    """A retained cluster's name; it is stopped afterwards and nothing of it may be left."""
    import subprocess
    import sys

    from monarch_nb import cluster_dir

    from conftest import cluster_processes, wait_until

    name = "lightning-restart"
    yield name
    path = cluster_dir.cluster_path(name)
    subprocess.run([sys.executable, "-m", "monarch_nb.cli", "cluster", "stop", name], capture_output=True, timeout=120)
    assert wait_until(lambda: not cluster_processes(path), 15), cluster_processes(path)


def test_a_kernel_restart_mid_fit_leaves_the_training_going_and_connect_shows_it(retained, tmp_path):
    from kernels import Kernel

    # What the kernels found, written to a file: their stdout also carries the ranks' lines,
    # which may land in the middle of a printed line.
    found = tmp_path / "found.json"
    save = f"import json\njson.dump(found, open({str(found)!r}, 'w'))\n"
    kernel = Kernel()
    try:
        # The notebook's own model, callback and actor, in a retained cluster; the fit
        # started and its first epoch seen, then the kernel is restarted under it. Epochs
        # enough that a slow restart (a loaded CI machine: 15 were all done) finds it running.
        kernel.run(f"import monarch_nb\ncluster = monarch_nb.Cluster.start({retained!r})\n"
                   + _notebook_cells("class DigitClassifier", "class LightningRank", "spawn_procs"), timeout=180)
        kernel.run("found = {'pids': procs.pids}\n" + save)
        pids = json.loads(found.read_text())["pids"]
        kernel.run("port, receiver = Channel.open()\n"
                   "fit = ranks.fit.call(DigitClassifier, digits_loaders, port, max_epochs=120, lr=0.005)\n"
                   "while receiver.recv().get(timeout=120)['kind'] != 'epoch':\n"
                   "    pass\n", timeout=180)
        kernel.restart()

        kernel.run(f"import monarch_nb, time\ncluster = monarch_nb.connect({retained!r})\n"
                   "epochs = lambda: [r['text'] for r in cluster.logs(mesh='lightning', grep='^epoch ')]\n"
                   "at_connect = epochs()\n"
                   # the ranks keep training without their kernel: epoch lines still arrive
                   "deadline = time.monotonic() + 120\n"
                   "while len(epochs()) <= len(at_connect) and time.monotonic() < deadline:\n"
                   "    time.sleep(0.2)\n"
                   "found = {'before': len(at_connect), 'after': len(epochs())}\n" + save, timeout=180)
        grown = json.loads(found.read_text())
        assert grown["after"] > grown["before"] >= 1, grown
        # The fit's result can come back before its last epoch line reached the log store.
        kernel.run("ranks = cluster.actor_meshes['lightning']\n"
                   "result = list(ranks.last_result.call().get().values())\n"
                   "deadline = time.monotonic() + 60\n"
                   "while not epochs()[-1].startswith('epoch 119:') and time.monotonic() < deadline:\n"
                   "    time.sleep(0.2)\n"
                   "found = {'result': result,\n"
                   "         'pids': cluster.proc_meshes['lightning_procs'].pids, 'last': epochs()[-1]}\n" + save,
                   timeout=300)
    finally:
        kernel.shutdown()
    end = json.loads(found.read_text())
    assert end["pids"] == pids  # the same procs: nothing was restarted
    assert end["last"].startswith("epoch 119: step 2880,"), end  # all 120 epochs ran
    assert [sorted(r) for r in end["result"]] == [["train_loss", "val_acc"]] * 2, end
