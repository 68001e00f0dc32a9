"""Stopping a proc mesh finalizes its procs' user code, as Python's exit does (Monarch's
``test_del_runs_on_proc_mesh_stop``): ``atexit`` handlers run and the user's module
globals are released, so their ``__del__`` run."""

from __future__ import annotations

import sys

import psutil

from finalizer_actors import LeavesMarks
from monarch_nb.proc import finalize


def test_stopping_a_proc_mesh_runs_atexit_handlers_and_module_globals_del(host, tmp_path):
    procs = host.spawn_procs(per_host={"gpus": 2})
    pids = list(procs.spawn("marks", LeavesMarks, str(tmp_path)).pid.call().get(timeout=60).values())
    procs.stop()  # blocks until the procs have exited
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
    for pid in pids:
        assert (tmp_path / f"del-{pid}").read_text() == "finalized"
        assert (tmp_path / f"atexit-{pid}").read_text() == "ran"


def test_a_procs_user_modules_are_its_own_files_not_the_library_or_monarch_nb():
    import finalizer_actors
    import json

    import monarch_nb.actor

    found = finalize.user_modules({m.__name__: m for m in (finalizer_actors, json, monarch_nb.actor, sys)})
    assert found == [finalizer_actors]
