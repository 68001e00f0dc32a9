"""A breakpoint in an unchanged LightningModule's training_step, on one rank of a DDP fit
run by actors (issue 27 item 5): set from the client, that rank pauses there, its local
variables are read through the debugger, and after continue the fit ends on every rank."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning", reason="Lightning is not installed: pip install 'monarch_nb[lightning]'")

from conftest import wait_until  # noqa: E402
from lightning_actors import FitRank, TinyRegressor  # noqa: E402

BOUND_S = 120


def test_a_breakpoint_in_training_step_pauses_rank_0_whose_locals_the_client_reads(host, cluster):
    dbg = cluster.debugger
    procs = host.spawn_procs(per_host={"procs": 2}, name="lt_procs")
    try:
        procs.setup_torch_distributed(backend="gloo")
        ranks = procs.spawn("lt", FitRank)
        bp = dbg.set_breakpoint(TinyRegressor.training_step, mesh="lt", ranks="0")
        fit = ranks.fit.call(3)
        stops = dbg.wait_paused(1, "lt", timeout=BOUND_S)
        assert [(s.rank, s.function) for s in stops] == [(0, "training_step")]
        assert [s.rank for s in dbg.paused()] == [0]  # rank 1 runs on (and waits in DDP's all-reduce)
        assert dict(dbg.eval("batch_idx", "lt", 0)) == {("lt", 0): "0"}
        assert dict(dbg.eval("tuple(batch[0].shape)", "lt", 0)) == {("lt", 0): "(8, 4)"}  # its share of a batch
        dbg.clear_breakpoints(bp["id"])
        dbg.continue_("lt", 0)
        assert list(fit.get(timeout=BOUND_S).values()) == [3, 3]  # both ranks fitted to the end
    finally:
        dbg.continue_all()
        dbg.clear_breakpoints()
        assert wait_until(lambda: not dbg.paused(), 10)
        procs.stop()
