"""Slurm allocator: hosts come from a batch job whose ``srun`` starts one host agent per
node.

``Cluster.start("train", allocator=SlurmAllocator(nodes=2, partition="debug"))``
submits ``sbatch --nodes=2 --ntasks-per-node=1 ...`` from this machine (the hub's).
The job's single step runs ``python -m monarch_nb.host`` on every node; agent ``i`` is
Slurm task ``i`` (``SLURM_PROCID``) and becomes index ``i`` of the host mesh's
``hosts`` dimension, so the order is the job's node list order. Agents bind on the
interface that routes to the hub and sign every message with the cluster key, which
they read from the cluster directory: the directory and the Python environment must
be on a filesystem the nodes share, as is usual on Slurm clusters.

``job_script()`` is the batch script (its ``#SBATCH`` lines, the set-up lines, the
agents' step), for a preview before submitting; ``--dry-run`` prints it from
``monarch-nb cluster start`` and ``%monarch start``. Options not given come from the
``[slurm]`` table of ``$MONARCH_NB_HOME/config.toml`` (``slurm_config``).

The job is the allocation: stopping the cluster ends it (agents exit, then
``scancel``), and a job that ends from outside (``scancel``, time limit, node
failure, preemption) shows up within about a second as failed hosts whose procs'
calls raise ``SupervisionError`` naming the job's state. Accounting is not needed:
job state comes from ``scontrol show job``.

The agents' step runs with ``--overlap`` (Slurm >= 20.11) and exports ``SLURM_OVERLAP``
to the procs, so an ``srun`` started by an actor becomes a step of the same job that
shares the node's CPUs instead of waiting forever for the agents' step to end; on older
Slurm such an ``srun`` fails after ``STEP_WAIT_S`` seconds when it can't get CPUs.
"""

from __future__ import annotations

import getpass
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from typing import Any, Sequence

from .. import cluster_dir as cluster_dirs
from ..errors import ClusterError
from ..wire import interfaces
from . import slurm_config, slurm_parse

OVERLAP_SINCE = (20, 11)  # srun --overlap; before it, the steps of a job shared CPUs by default
STEP_WAIT_S = 60  # without --overlap: how long an actor's own srun waits for CPUs before it fails
COMMAND_TIMEOUT_S = 30.0  # sbatch/scontrol/scancel; they block while the controller is unreachable
CANCEL_WAIT_S = 10.0  # how long stop() waits for a cancelled job to end
POLL_S = 0.1
JOB_SCRIPT = "slurm-job.sh"
JOB_OUTPUT = "slurm-%j.out"  # the agents' own stdout/stderr (procs' output goes to the hub)


class SlurmAllocator:
    """Hosts from a Slurm batch job (see the module docstring).

    ``nodes``: hosts in the mesh (one host agent each). ``partition``, ``time``
    (``"HH:MM:SS"``, ``"MM"``, ``"D-HH"``... as ``sbatch --time``), ``mem`` (memory
    per node, as ``sbatch --mem``: ``"64G"``), ``gpus_per_node``, ``cpus_per_task``
    (CPUs each agent and its procs may use), ``account``, ``qos``: as the ``sbatch``
    options of the same names; ``None`` leaves Slurm's default. ``setup``: shell lines
    the job runs before it starts the agents, e.g. ``["module load cuda",
    "source venv/bin/activate"]`` (the agents' step inherits their environment).
    ``extra_sbatch_args``: more ``sbatch`` options, one ``--name=value`` each, e.g.
    ``["--exclusive", "--constraint=a100"]``. ``start_timeout``: seconds to wait for
    every agent to report, queue wait included (default 300); past it, starting fails
    with the job's state and reason. ``bind``: the hub's interface (default: the one
    that routes to the partition's nodes; loopback when they are this machine).
    ``job_name``: default ``monarch_nb-CLUSTER``. The job step gets every GPU of the
    job on its node (``srun``'s default), so procs see them all
    (``CUDA_VISIBLE_DEVICES`` as Slurm sets it).

    ``defaults``: settings for the arguments not given (``None`` here); by default the
    ``[slurm]`` table of ``$MONARCH_NB_HOME/config.toml`` (see ``slurm_config``).

    Raises ``ValueError`` for a bad argument or config file and :class:`ClusterError`
    when Slurm's commands are not installed here."""

    kind = "slurm"

    def __init__(self, nodes: int = 1, partition: str | None = None, time: str | None = None,
                 gpus_per_node: int | None = None, cpus_per_task: int | None = None, account: str | None = None,
                 qos: str | None = None, extra_sbatch_args: Sequence[str] | None = None,
                 start_timeout: float | None = None, bind: str | None = None, job_name: str | None = None,
                 mem: str | None = None, setup: Sequence[str] | None = None, *,
                 defaults: dict[str, Any] | None = None):
        given = {"partition": partition, "time": time, "mem": mem, "gpus_per_node": gpus_per_node,
                 "cpus_per_task": cpus_per_task, "account": account, "qos": qos, "setup": setup,
                 "extra_sbatch_args": extra_sbatch_args, "start_timeout": start_timeout, "bind": bind,
                 "job_name": job_name}
        chosen = {**(slurm_config.defaults() if defaults is None else defaults),
                  **{k: v for k, v in given.items() if v is not None}}
        partition, time, mem, account, qos, bind, job_name = (
            chosen.get(k) for k in ("partition", "time", "mem", "account", "qos", "bind", "job_name"))
        gpus_per_node, cpus_per_task = chosen.get("gpus_per_node"), chosen.get("cpus_per_task")
        extra_sbatch_args, setup = chosen.get("extra_sbatch_args", ()), chosen.get("setup", ())
        start_timeout = chosen.get("start_timeout", 300.0)
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
            raise ValueError(f"nodes={nodes!r}: a Slurm cluster needs at least 1 node")
        for name, value in (("gpus_per_node", gpus_per_node), ("cpus_per_task", cpus_per_task)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name}={value!r}: give a whole number >= 1, or None for Slurm's default")
        if isinstance(extra_sbatch_args, str):
            raise ValueError(f"extra_sbatch_args={extra_sbatch_args!r}: give a list of options, "
                             f"e.g. {shlex.split(extra_sbatch_args)!r}")
        if isinstance(setup, str):
            raise ValueError(f"setup={setup!r}: give a list of shell lines, e.g. {setup.splitlines()!r}")
        if not start_timeout > 0:
            raise ValueError(f"start_timeout={start_timeout!r}: give a number of seconds > 0")
        if bind is not None:
            interfaces.check_bind_address(bind)
        for command in ("sbatch", "srun", "scontrol", "scancel"):
            if shutil.which(command) is None:
                raise ClusterError(f"{command} was not found on PATH: SlurmAllocator submits a batch job "
                                   "from this machine; run on a machine with Slurm's client commands "
                                   "(a login node), or add them to PATH")
        self.nodes = nodes
        self.options = {"partition": partition, "time": time, "mem": mem, "gpus_per_node": gpus_per_node,
                        "cpus_per_task": cpus_per_task, "account": account, "qos": qos}
        self.setup = [str(line) for line in setup]
        self.extra_sbatch_args = [str(a) for a in extra_sbatch_args]
        self.start_timeout_s = float(start_timeout)
        self.bind = bind
        self.job_name = job_name
        self.job_id: str | None = None
        self.host_ids: list[str] = []
        self.cluster_dir: str | None = None
        self.allocation = ""  # set by the hub for an allocation added to a running cluster
        self.grace_s = 10.0
        self.submitted: float | None = None  # time.time() of sbatch, for the queue-wait figure

    # spec --------------------------------------------------------------------------
    @property
    def hosts(self) -> int:
        return self.nodes

    def spec(self) -> dict:
        return {"kind": self.kind, "nodes": self.nodes, **self.options, "setup": self.setup,
                "extra_sbatch_args": self.extra_sbatch_args,
                "start_timeout": self.start_timeout_s, "bind": self.bind, "job_name": self.job_name,
                "job_id": self.job_id, "host_ids": self.host_ids, "submitted": self.submitted}

    @classmethod
    def from_spec(cls, spec: dict, cluster_dir: str, grace_s: float, allocation: str = "") -> "SlurmAllocator":
        """The allocator of ``spec`` in the hub; ``allocation``: see ``allocators.create``."""
        spec = dict(spec)
        job_id, host_ids, submitted = spec.pop("job_id", None), spec.pop("host_ids", []), spec.pop("submitted", None)
        allocator = cls(**spec, defaults={})  # the spec is complete: the config file may have changed since
        allocator.cluster_dir, allocator.grace_s, allocator.allocation = cluster_dir, grace_s, allocation
        allocator.job_id, allocator.host_ids, allocator.submitted = job_id, list(host_ids), submitted
        if allocator.job_name is None:
            allocator.job_name = f"monarch_nb-{Path(cluster_dir).name}" + (f"-{allocation}" if allocation else "")
        return allocator

    @property
    def _host_prefix(self) -> str:
        return f"{self.allocation}-" if self.allocation else ""

    def __repr__(self) -> str:
        opts = "".join(f", {k}={v!r}" for k, v in self.options.items() if v is not None)
        return f"SlurmAllocator(nodes={self.nodes}{opts})" + (f" job {self.job_id}" if self.job_id else "")

    # the protocol ------------------------------------------------------------------------
    def bind_address(self) -> str:
        """``bind``, else the local address that routes to the partition's first node
        (``127.0.0.1`` when the nodes are this machine), else the one that routes to
        this machine's own name."""
        if self.bind:
            return self.bind
        try:
            node = self._partition_nodes()[0]
            addr = _one(self._scontrol("show", "node", "-o", node)).get("NodeAddr") or node
            return interfaces.route_source(addr)
        except (ClusterError, OSError, IndexError, ValueError):
            return interfaces.route_source(socket.gethostname())

    def cancel_start(self) -> None:
        pass  # start() submits one job and returns: stop() cancels it

    def start(self, hub_address: str, hosts: int) -> list[str]:
        """Submit the job (returns at once; agents report when it runs). Raises
        :class:`ClusterError` with sbatch's message when Slurm refuses the job."""
        if hosts != self.nodes:
            raise ClusterError(f"SlurmAllocator has nodes={self.nodes}, but {hosts} hosts were asked for")
        assert self.cluster_dir is not None, "the hub's allocator is made by from_spec, with its cluster directory"
        self._check_partition_size()
        script = Path(self.cluster_dir) / (f"{self._host_prefix}{JOB_SCRIPT}")
        script.write_text(self.job_script(hub_address=hub_address))
        script.chmod(0o700)
        self.submitted = time.time()
        out = _run(["sbatch", "--parsable", str(script)])
        self.job_id = slurm_parse.parse_sbatch(out)
        self.host_ids = [f"{self._host_prefix}host{i}" for i in range(self.nodes)]
        options = " ".join(self._directives())
        print(f"monarch_nb hub: submitted Slurm job {self.job_id} ({options})", file=sys.stderr)
        return list(self.host_ids)

    def _directives(self, cluster_dir: str | None = None, job_name: str | None = None) -> list[str]:
        """The ``sbatch`` options of the job, as its ``#SBATCH`` lines carry them."""
        folder = Path(cluster_dir or self.cluster_dir or ".")
        options = [f"--job-name={job_name or self.job_name}", f"--nodes={self.nodes}", "--ntasks-per-node=1",
                   f"--output={folder / JOB_OUTPUT}", f"--chdir={Path.cwd()}"]
        options += [f"--{k.replace('_', '-')}={v}" for k, v in self.options.items() if v is not None]
        return options + self.extra_sbatch_args

    def job_script(self, name: str | None = None, hub_address: str | None = None) -> str:
        """The batch script this allocator submits: ``#SBATCH`` lines, then ``setup``,
        then the step that starts one host agent per node. Before the cluster exists
        (a preview), ``name`` is the cluster's name, and the hub's address, known once
        the hub runs, reads ``HUB_ADDRESS``."""
        folder = self.cluster_dir or (str(cluster_dirs.cluster_path(name)) if name else "CLUSTER_DIR")
        job_name = self.job_name or f"monarch_nb-{name or Path(folder).name}"
        # Paths travel as positional parameters of sh -c, so no quoting can break them.
        step = ["srun", "--kill-on-bad-exit=0", "--ntasks-per-node=1"]
        if self.options["cpus_per_task"]:  # srun no longer inherits it from sbatch (Slurm >= 22.05)
            step.append(f"--cpus-per-task={self.options['cpus_per_task']}")
        # The agents' step holds the job's CPUs for as long as the cluster runs: an actor's
        # own srun (a step of the same job: procs inherit the job's variables) must share
        # them, or it waits forever. SLURM_OVERLAP is --overlap for every srun that inherits it.
        version = slurm_parse.parse_version(_run(["srun", "--version"]))
        if version is not None and version >= OVERLAP_SINCE:
            step.append("--overlap")
            share = "export SLURM_OVERLAP=1"
        else:  # no --overlap here: an actor's srun that can't get CPUs fails after a while instead
            share = f"export SLURM_IMMEDIATE={STEP_WAIT_S}"
        agent = ('exec "$0" -m monarch_nb.host --cluster-dir "$1" --hub "$2" --grace "$3" --bind auto '
                 '--host-id "$4host$SLURM_PROCID" --node "$SLURMD_NODENAME"')
        args = [sys.executable, folder, hub_address or "HUB_ADDRESS", str(self.grace_s), self._host_prefix]
        lines = ["#!/bin/bash", *(f"#SBATCH {shlex.quote(o)}" for o in self._directives(folder, job_name)),
                 f"# monarch_nb cluster {Path(folder).name}: one host agent per node, dialing the hub.",
                 'echo "monarch_nb: job $SLURM_JOB_ID running on $SLURM_JOB_NODELIST at $(date +%s.%N)"',
                 share,
                 *self.setup,
                 f"exec {shlex.join(step)} /bin/sh -c {shlex.quote(agent)} {shlex.join(args)}"]
        return "\n".join(lines) + "\n"

    def adopt(self, pids: dict[str, int]) -> None:
        """Nothing to do: the agents run under the job restored from the spec."""

    def job(self) -> dict[str, str] | None:
        """The job's ``scontrol show job`` record; ``None`` once Slurm has forgotten it.
        Raises :class:`ClusterError` when the controller does not answer."""
        if self.job_id is None:
            return None
        try:
            return _one(self._scontrol("show", "job", "-o", self.job_id))
        except ClusterError as e:
            if "Invalid job id" in str(e):
                return None
            raise

    def check(self) -> dict[str, str]:
        """Every host, once the job has ended: ``{"host0": "Slurm job 12 was CANCELLED", ...}``."""
        try:
            record = self.job()
        except ClusterError:
            return {}  # the controller is busy or restarting: no news is not bad news
        if record is None:
            why = f"Slurm job {self.job_id} is gone"
        else:
            state, reason = slurm_parse.job_state(record)
            if state not in slurm_parse.FINAL_STATES:
                return {}
            why = f"Slurm job {self.job_id} was {state}" + (f" ({reason})" if reason else "")
        return {h: why for h in self.host_ids}

    def waiting_for(self) -> str:
        if self.job_id is None:
            return "the Slurm job was not submitted"
        try:
            record = self.job()
        except ClusterError as e:
            return f"Slurm job {self.job_id}: its state is unknown ({e})"
        if record is None:
            text = f"Slurm job {self.job_id} is gone"
        else:
            state, reason = slurm_parse.job_state(record)
            text = (f"Slurm job {self.job_id} is {state}, reason: {reason or 'None'}, "
                    f"nodes: {record.get('NodeList', '(null)')}, partition: {record.get('Partition', '?')}")
        output = Path(self.cluster_dir or ".") / JOB_OUTPUT.replace("%j", self.job_id)
        try:
            tail = output.read_text(errors="replace").strip().splitlines()[-5:]
        except OSError:
            tail = []
        return text + (f"; the end of {output}: " + " | ".join(tail) if tail else "")

    def stop(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the job to end by itself (agents told to
        shut down exit and the step ends), then ``scancel`` it and wait up to
        ``CANCEL_WAIT_S`` more; a job still in the queue (no agent to wait for) is
        cancelled at once. Raises :class:`ClusterError` if it is still running."""
        if self.job_id is None:
            return
        if self._wait_ended(0.0 if self._queued() else timeout):
            return
        try:
            _run(["scancel", self.job_id])
        except ClusterError as e:
            print(f"monarch_nb hub: {e}", file=sys.stderr)
        if not self._wait_ended(CANCEL_WAIT_S):
            raise ClusterError(f"Slurm job {self.job_id} did not end within {CANCEL_WAIT_S} s of scancel; "
                               f"check it with `scontrol show job {self.job_id}`")

    def _queued(self) -> bool:
        try:
            record = self.job()
        except ClusterError:
            return False
        return record is not None and slurm_parse.job_state(record)[0] == "PENDING"

    def _wait_ended(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            try:
                record = self.job()
                if record is None or slurm_parse.job_state(record)[0] in slurm_parse.FINAL_STATES:
                    return True
            except ClusterError:
                pass
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)

    # Slurm's commands ------------------------------------------------------------------
    def _scontrol(self, *args: str) -> list[dict[str, str]]:
        return slurm_parse.parse_scontrol(_run(["scontrol", *args]))

    def _check_partition_size(self) -> None:
        """Raise :class:`ClusterError` for more nodes than the partition has: Slurm
        (``EnforcePartLimits=NO``, its default) queues such a job for good (reason
        ``PartitionConfig``), and the start would wait out its whole timeout."""
        try:
            nodes = self._partition_nodes()
        except (ClusterError, IndexError, ValueError):  # a list of partitions, say: Slurm decides
            return
        if nodes and self.nodes > len(nodes):
            where = f"partition {self.options['partition']!r}" if self.options["partition"] else "the default partition"
            raise ClusterError(f"SlurmAllocator(nodes={self.nodes}): {where} has {len(nodes)} node(s) "
                               f"({', '.join(nodes)}); ask for at most {len(nodes)}, or choose another partition")

    def _partition_nodes(self) -> list[str]:
        records = self._scontrol("show", "partition", "-o", *([self.options["partition"]]
                                                               if self.options["partition"] else []))
        if not self.options["partition"]:
            records = [r for r in records if r.get("Default") == "YES"] or records
        return slurm_parse.expand_hostlist(records[0].get("Nodes", "")) if records else []


def release_leftovers(spec: dict, cluster_dir: str) -> list[str]:
    """Cancel what is left of a Slurm cluster whose hub is gone: the job ``spec`` (from
    its state file) names, and any job of this user with the cluster's job name (one a
    dying hub submitted but never recorded). Returns the job ids cancelled; Slurm
    errors are ignored (the job may be long gone)."""
    name = spec.get("job_name") or f"monarch_nb-{Path(cluster_dir).name}"
    jobs = {spec["job_id"]} if spec.get("job_id") else set()
    try:
        listed = _run(["squeue", "-h", "-u", getpass.getuser(), "-n", name, "-o", "%i|%j|%T|%r|%N"])
        jobs.update(r["id"] for r in slurm_parse.parse_squeue(listed, ["id", "name", "state", "reason", "nodes"])
                    if r["name"] == name)
    except ClusterError as e:
        print(f"monarch_nb: {e}", file=sys.stderr)
    if jobs:
        try:
            _run(["scancel", *sorted(jobs)])
        except ClusterError as e:
            print(f"monarch_nb: {e}", file=sys.stderr)
    return sorted(jobs)


def _one(records: list[dict]) -> dict:
    if not records:
        raise ClusterError("scontrol printed no record")
    return records[0]


def _run(argv: list[str]) -> str:
    """Run a Slurm command; its stdout. Raises :class:`ClusterError` with its message
    when it fails or takes over ``COMMAND_TIMEOUT_S`` (the controller is unreachable)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{shlex.join(argv)}` did not finish within {COMMAND_TIMEOUT_S} s; "
                           "is slurmctld running and reachable?") from None
    except FileNotFoundError:
        raise ClusterError(f"{argv[0]} was not found on PATH; SlurmAllocator needs Slurm's client commands") from None
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip() or f"exit code {done.returncode}"
        raise ClusterError(f"`{shlex.join(argv)}` failed: {message}")
    return done.stdout
