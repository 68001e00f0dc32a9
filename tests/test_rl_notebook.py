"""notebooks/rl_loop.ipynb runs top to bottom in a real kernel (as CI runs every example
notebook): a generator service of 4 replicas, reward actors and a DDP trainer learn a+b,
and a generator replica SIGKILLed midway costs no request."""

from __future__ import annotations

import re

from test_notebooks import _run_without_errors


def test_rl_loop_learns_and_survives_a_killed_generator_replica(tmp_path):
    nb, text = _run_without_errors("rl_loop", tmp_path)
    assert "failed requests: 0" in text
    assert re.search(r"replica 2: healthy, restarts 1, replaced in \d+ ms", text), text
    first, last = map(float, re.search(r"first 5 steps ([\d.]+), last 5 steps ([\d.]+)", text).groups())
    assert first < 0.4 and last > 0.8, (first, last)  # it learned
    assert "generators updated 3" in text  # the loop went on while the replica was replaced
