"""Starting a job's batch client (Monarch's ``job.apply(client_script=...)``): the job
runs its own client, a script started in the background, instead of the program that
applied it.

``apply(client_script="train.py")`` allocates the job, pickles it wrapped in a
``BatchJob`` (:mod:`.job`) to ``.monarch/job_state.pkl``, and :func:`start_client`
starts ``python train.py`` in a session of its own with ``MONARCH_BATCH_JOB=1``, its
output going to ``.monarch/logs/job_XXXX/stdout.log`` and ``stderr.log``. In the
script, ``AnyJob().state()`` finds the cached ``BatchJob``, which serves any
specification in batch mode, so the script gets the applied job's host meshes (by the
applied job's names) and ends the job's allocation when it exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

BATCH_ENV = "MONARCH_BATCH_JOB"  # "1" in the environment of a batch job's client script
LOG_ROOT = ".monarch/logs"


def in_batch_job() -> bool:
    """True in a client script a job started (``apply(client_script=...)``)."""
    return os.environ.get(BATCH_ENV) == "1"


class ClientScript:
    """A batch client started by :func:`start_client`: ``process`` is its
    ``subprocess.Popen``, ``log_dir`` holds its ``stdout.log`` and ``stderr.log``."""

    def __init__(self, process: subprocess.Popen, log_dir: str):
        self.process = process
        self.log_dir = log_dir


def start_client(client_script: str) -> ClientScript:
    """Start ``client_script`` with this interpreter in a new session (it outlives this
    process), with ``MONARCH_BATCH_JOB=1`` and its output in a fresh folder under
    ``.monarch/logs``; returns at once."""
    os.makedirs(LOG_ROOT, exist_ok=True)
    log_dir = tempfile.mkdtemp(prefix="job_", dir=LOG_ROOT)
    env = {**os.environ, BATCH_ENV: "1"}
    with open(os.path.join(log_dir, "stdout.log"), "wb") as out, open(os.path.join(log_dir, "stderr.log"), "wb") as err:
        process = subprocess.Popen([sys.executable, client_script], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=err, start_new_session=True)
    return ClientScript(process, log_dir)
