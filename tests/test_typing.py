"""Endpoint types a type checker follows: ``mesh.ENDPOINT.call(...)`` is checked
against the method, as a call of the method would be (``tests/typecheck/endpoints.py``)."""

from __future__ import annotations

import re
from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parent.parent
CHECKED = Path("tests") / "typecheck" / "endpoints.py"


def expected_errors() -> set[tuple[int, str]]:
    """(line, mypy error code) for every line of the checked file marked ``# E: CODE``."""
    lines = (ROOT / CHECKED).read_text().splitlines()
    return {(n, m.group(1)) for n, text in enumerate(lines, 1) if (m := re.search(r"# E: ([a-z-]+)", text))}


def test_endpoint_calls_type_check_like_the_method(monkeypatch):
    # From the repository root, so that mypy reads its config and this checkout's package.
    monkeypatch.chdir(ROOT)
    out, err, _ = api.run(["--no-error-summary", "--show-error-codes", "--follow-imports=silent", str(CHECKED)])
    found = {(int(m.group(1)), m.group(2)) for m in re.finditer(r"^[^:]+:(\d+): error: .*\[([a-z-]+)\]$", out, re.M)}
    assert not err, err
    assert found == expected_errors(), out
