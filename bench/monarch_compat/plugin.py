"""pytest plugin of the harness, loaded with ``-p`` in the pytest process it starts.

Reads its settings from the environment (set by run.py):

- ``MONARCH_COMPAT_RESULTS``: a JSON-lines file; one ``start`` line when a test begins
  and one ``done`` line (outcome, first line of the failure, seconds) when it ends, so
  the harness knows which test was running if the process dies.
- ``MONARCH_COMPAT_DESELECT``: a JSON file ``{"nodeids": [...], "keys": [[file, class,
  function], ...]}`` of tests not to run (done before a crash, or not selected).
- ``MONARCH_COMPAT_TIMEOUT``: seconds; caps every test's pytest-timeout, including
  timeouts Monarch's tests set with ``@pytest.mark.timeout``.
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

_results = os.environ["MONARCH_COMPAT_RESULTS"]
_cap = float(os.environ.get("MONARCH_COMPAT_TIMEOUT", "60"))
_outcomes: dict[str, dict] = {}


def _write(record: dict) -> None:
    with open(_results, "a") as f:
        f.write(json.dumps(record) + "\n")


def item_key(item) -> list:
    """[file relative to the rootdir, class name or None, function name]: how the
    classifier names a test, for every parametrization of it."""
    return [str(item.path.relative_to(item.config.rootpath)), item.cls.__name__ if item.cls else None,
            getattr(item, "originalname", item.name)]


def pytest_collection_modifyitems(config, items):
    deselect_file = os.environ.get("MONARCH_COMPAT_DESELECT")
    spec = json.load(open(deselect_file)) if deselect_file else {"nodeids": [], "keys": []}
    nodeids, keys = set(spec["nodeids"]), {tuple(k) for k in spec["keys"]}
    kept, dropped = [], []
    for item in items:
        (dropped if item.nodeid in nodeids or tuple(item_key(item)) in keys else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    for item in items:
        marker = item.get_closest_marker("timeout")
        given = marker.args[0] if marker and marker.args else marker.kwargs.get("timeout") if marker else None
        cap = _cap if given is None else min(float(given), _cap)
        item.add_marker(pytest.mark.timeout(cap), append=False)


def pytest_collectreport(report):
    if report.failed:
        _write({"event": "collect_error", "nodeid": report.nodeid, **_message(report)})


def pytest_runtest_logstart(nodeid, location):
    _write({"event": "start", "nodeid": nodeid, "time": time.time()})


def pytest_runtest_logreport(report):
    entry = _outcomes.setdefault(report.nodeid, {"outcome": "passed", "message": "", "remote": "", "seconds": 0.0})
    entry["seconds"] += report.duration
    if entry["outcome"] != "passed":
        return  # the first failure says why
    if report.skipped:
        entry["outcome"] = "skipped"
        entry["message"] = _skip_reason(report)
    elif report.failed:
        entry["outcome"] = "failed" if report.when == "call" else "error"
        entry.update(_message(report))


def pytest_runtest_logfinish(nodeid, location):
    entry = _outcomes.pop(nodeid, {"outcome": "error", "message": "no report", "seconds": 0.0})
    _write({"event": "done", "nodeid": nodeid, **entry})


def pytest_itemcollected(item):
    _write({"event": "item", "nodeid": item.nodeid, "key": item_key(item)})


def _message(report) -> dict:
    """The failure's first line, and for an error that carries a traceback from another
    process (an endpoint's ``ActorError``, isolate_in_subprocess) that error's own
    exception line as ``remote``: it, not the endpoint's name, says what went wrong."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    first = lines[0].strip() if lines else ""
    raised = [line for line in lines[1:] if _EXCEPTION_LINE.match(line) and "ActorError" not in line]
    return {"message": first, "remote": raised[-1] if raised and "Traceback" in text else ""}


_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception|Exit|Interrupt|Failure)(?:: |$)")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
