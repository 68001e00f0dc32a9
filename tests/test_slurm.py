"""Clusters on a real Slurm: the one .ci/setup.d/30-slurm.sh starts (slurmctld, and two
emulated nodes n1, n2 on this machine). Every test submits real jobs; none may leave a
job or a process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

import monarch_nb
from monarch_nb import cluster_dir
from monarch_nb.actor import Actor, SupervisionError, current_rank, endpoint
from monarch_nb.allocators import slurm_parse
from monarch_nb.allocators.slurm import SlurmAllocator
from monarch_nb.client.cluster import Cluster
from monarch_nb.errors import ClusterError, ClusterNotFound, InvalidRequest

from conftest import cluster_processes, system_part_missing, wait_until

SLURMCTLD_PID = "/run/monarch-nb-slurm/slurmctld.pid"
NODES = ["n1", "n2"]


class Trainer(Actor):
    """The quickstart's actor, reporting where Slurm put it."""

    def __init__(self, greeting: str = "hello"):
        self.greeting = greeting
        self.steps = 0

    @endpoint
    def say_hello(self, name: str) -> str:
        return f"{self.greeting}, {name}! from rank {current_rank().rank}"

    @endpoint
    def train(self, step: int) -> float:
        self.steps += 1
        return round(1.0 / (step + 1) + 0.01 * current_rank().rank, 3)

    @endpoint
    def where(self) -> tuple:
        return os.environ.get("SLURMD_NODENAME"), os.environ.get("SLURM_JOB_ID"), os.getpid()

    @endpoint
    def wait(self, seconds: float) -> int:
        time.sleep(seconds)
        return os.getpid()

    @endpoint
    def set_greeting(self, greeting: str) -> None:
        self.greeting = greeting

    @endpoint
    def srun(self, *argv: str) -> str:
        """An srun of the actor's own: a step of the cluster's job."""
        try:
            done = subprocess.run(["srun", *argv], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return "srun did not start within 60 s"
        return done.stdout.strip() or done.stderr.strip()


def scontrol_job(job_id: str) -> dict | None:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
    records = slurm_parse.parse_scontrol(out.stdout)
    return records[0] if out.returncode == 0 and records else None


def job_ended(job_id: str) -> bool:
    record = scontrol_job(job_id)
    return record is None or slurm_parse.job_state(record)[0] in slurm_parse.FINAL_STATES


def job_steps_alive(job_id: str) -> list[psutil.Process]:
    """slurmstepd processes (and their tasks) still running for the job on this machine."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if f"[{job_id}." in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


@pytest.fixture(scope="module", autouse=True)
def slurm():
    """Slurm must be up: without a controller, Slurm's commands block for minutes."""
    try:
        alive = psutil.pid_exists(int(open(SLURMCTLD_PID).read()))
    except (OSError, ValueError):
        alive = False
    if not alive:
        system_part_missing(f"slurmctld is not running ({SLURMCTLD_PID}); start it with "
                            "`bash .ci/setup.d/30-slurm.sh`")
    out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    if "UP" not in out.stdout:
        system_part_missing(f"Slurm's controller does not answer `scontrol ping`: {(out.stdout + out.stderr).strip()}")


@pytest.fixture
def started():
    """Clusters a test starts (by name); each is stopped afterwards, and neither its job
    nor any of its processes may be left."""
    names: list[str] = []
    yield names
    for name in names:
        try:
            monarch_nb.connect(name).stop()
        except ClusterNotFound:
            pass
    assert not [n for n in names if cluster_dir.cluster_path(n).exists()]


def job_of(cluster: Cluster) -> str:
    return cluster.info()["allocator"]["job_id"]


def test_a_two_node_job_runs_the_quickstart_and_stop_leaves_nothing(started):
    started.append("slurm-quick")
    cluster = Cluster.start("slurm-quick", allocator=SlurmAllocator(nodes=2, partition="debug", start_timeout=60))
    job_id = job_of(cluster)
    record = scontrol_job(job_id)
    assert slurm_parse.job_state(record)[0] == "RUNNING"
    assert record["JobName"] == "monarch_nb-slurm-quick"
    # hosts dimension = the job's node list, in order
    health = cluster.health()
    assert [h["node"] for h in health["hosts"]] == slurm_parse.expand_hostlist(record["NodeList"]) == NODES
    host = cluster.host_mesh()
    assert dict(host.extent) == {"hosts": 2}

    procs = host.spawn_procs(per_host={"gpus": 2})
    trainers = procs.spawn("trainers", Trainer, greeting="hello")
    where = trainers.where.call().get(timeout=60)
    assert [where.item(hosts=h, gpus=g)[:2] for h in range(2) for g in range(2)] == [
        ("n1", job_id), ("n1", job_id), ("n2", job_id), ("n2", job_id)]
    assert trainers.train.call(step=0).get(timeout=60).values() == [1.0, 1.01, 1.02, 1.03]
    hello = trainers.slice(hosts=1).say_hello.call("world").get(timeout=60)
    # current_rank() is the point in the slice called, as in Monarch: ranks 0 and 1 of the second host's
    assert hello.values() == ["hello, world! from rank 0", "hello, world! from rank 1"]
    assert trainers.slice(hosts=0, gpus=1).say_hello.call_one("nb").get(timeout=60) == "hello, nb! from rank 0"
    trainers.set_greeting.broadcast("bonjour")
    assert trainers.say_hello.call("x").get(timeout=60).values()[3] == "bonjour, x! from rank 3"
    assert sorted(fut.get(timeout=60) for fut in trainers.train.stream(1)) == [0.5, 0.51, 0.52, 0.53]

    path = cluster.path
    cluster.stop()
    assert job_ended(job_id), scontrol_job(job_id)
    assert slurm_parse.job_state(scontrol_job(job_id))[0] == "COMPLETED"  # its agents exited: no cancel needed
    assert wait_until(lambda: not job_steps_alive(job_id) and not cluster_processes(path), 10), (
        job_steps_alive(job_id), cluster_processes(path))
    assert not path.exists()


def test_an_actors_own_srun_runs_inside_the_clusters_job(started):
    started.append("slurm-srun")
    cluster = Cluster.start("slurm-srun", allocator=SlurmAllocator(nodes=1, partition="debug", start_timeout=60))
    trainer = cluster.host_mesh().spawn_procs(per_host={"gpus": 1}).spawn("trainer", Trainer)
    # The agents' step holds the node's CPUs; without --overlap this srun waits forever.
    out = trainer.srun.call_one("--nodes=1", "--ntasks=1", "printenv", "SLURM_STEP_ID").get(timeout=90)
    assert out.isdigit() and out != "0", out


def test_scancel_from_outside_fails_calls_and_shows_failed_hosts(started):
    started.append("slurm-cancel")
    cluster = Cluster.start("slurm-cancel", allocator=SlurmAllocator(nodes=2, start_timeout=60))
    job_id = job_of(cluster)
    trainers = cluster.host_mesh().spawn_procs(per_host={"gpus": 1}).spawn("t", Trainer)
    pids = [w[2] for w in trainers.where.call().get(timeout=60).values()]
    pending = trainers.wait.call(120)
    t0 = time.monotonic()
    subprocess.run(["scancel", job_id], check=True, timeout=30)
    with pytest.raises(SupervisionError) as info:
        pending.get(timeout=60)
    seen_s = time.monotonic() - t0
    # Within the supervision bound: well before a silent host agent would be noticed (3 s).
    assert seen_s < 3.0, seen_s
    assert f"Slurm job {job_id} was CANCELLED" in str(info.value) or "SIGTERM" in str(info.value), str(info.value)
    with pytest.raises(SupervisionError):
        trainers.say_hello.call("again").get(timeout=30)

    def cancelled_hosts():  # at once on the agents' word, then with the job's state (polled each second)
        hosts = cluster.health()["hosts"]
        return all(h["state"] == "failed" and f"Slurm job {job_id} was CANCELLED" in h["cause"] for h in hosts)
    assert wait_until(cancelled_hosts, 10), cluster.health()["hosts"]
    assert wait_until(lambda: not psutil.pid_exists(pids[0]) and not psutil.pid_exists(pids[1]), 10)
    path = cluster.path
    cluster.stop()
    assert job_ended(job_id) and wait_until(lambda: not cluster_processes(path), 10), cluster_processes(path)


def test_a_job_that_waits_past_the_start_timeout_fails_with_its_state_and_reason(started):
    started.append("slurm-wait")
    allocator = SlurmAllocator(nodes=2, start_timeout=3, extra_sbatch_args=["--begin=now+3600"])
    with pytest.raises(ClusterError) as info:
        Cluster.start("slurm-wait", allocator=allocator)
    message = str(info.value)
    assert "PENDING" in message and "BeginTime" in message, message
    job_id = message.split("Slurm job ")[1].split()[0]
    assert wait_until(lambda: job_ended(job_id), 30), scontrol_job(job_id)  # the hub cancelled it


def test_slurm_refusing_the_job_is_a_clear_error(started):
    started.append("slurm-refused")
    with pytest.raises(ClusterError, match="invalid partition"):
        Cluster.start("slurm-refused", allocator=SlurmAllocator(nodes=1, partition="no-such-partition"))


def test_bad_slurm_arguments_name_the_problem():
    with pytest.raises(ValueError, match="nodes=0"):
        SlurmAllocator(nodes=0)
    with pytest.raises(ValueError, match="gpus_per_node"):
        SlurmAllocator(gpus_per_node=-1)
    with pytest.raises(ValueError, match=r"\['--exclusive'\]"):
        SlurmAllocator(extra_sbatch_args="--exclusive")
    with pytest.raises(ValueError, match="every interface"):
        SlurmAllocator(bind="0.0.0.0")
    with pytest.raises(ValueError, match="allocator decides"):
        Cluster.start("slurm-bad", hosts=3, allocator=SlurmAllocator(nodes=2))


def test_a_retained_slurm_cluster_is_reconnectable_and_recoverable(started):
    started.append("slurm-keep")
    cluster = Cluster.start("slurm-keep", allocator=SlurmAllocator(nodes=2, start_timeout=60))
    job_id = job_of(cluster)
    trainers = cluster.host_mesh().spawn_procs(per_host={"gpus": 1}, name="keep").spawn("keep", Trainer)
    trainers.set_greeting.call("kept").get(timeout=60)
    # Starting it again (a re-run cell) connects; asking for local hosts instead is refused.
    assert job_of(Cluster.start("slurm-keep", allocator=SlurmAllocator(nodes=2))) == job_id
    with pytest.raises(InvalidRequest, match=r"2 host\(s\) \(slurm\)"):
        Cluster.start("slurm-keep", hosts=1)
    # Another client (a fresh process) finds the same actors.
    script = ("import monarch_nb\n"
              "m = monarch_nb.connect('slurm-keep').actor_meshes['keep']\n"
              "print(m.say_hello.call('there').get(timeout=60).values())\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(__file__))
    assert "kept, there! from rank 1" in out.stdout, out.stderr
    # The hub dies; a new one re-adopts the job's agents, procs and actors.
    hub_pid = cluster._info["hub_pid"]
    os.kill(hub_pid, signal.SIGKILL)
    assert wait_until(lambda: not psutil.pid_exists(hub_pid) or psutil.Process(hub_pid).status() == "zombie", 10)
    recovered = Cluster.recover("slurm-keep")
    assert job_of(recovered) == job_id and slurm_parse.job_state(scontrol_job(job_id))[0] == "RUNNING"
    keep = recovered.actor_meshes["keep"]
    assert keep.say_hello.call("back").get(timeout=60).values() == ["kept, back! from rank 0",
                                                                      "kept, back! from rank 1"]
    recovered.stop()
    assert job_ended(job_id)


def test_the_cli_starts_and_stops_a_slurm_cluster(started):
    started.append("slurm-cli")
    cli = [sys.executable, "-m", "monarch_nb.cli"]
    out = subprocess.run([*cli, "cluster", "start", "slurm-cli", "--slurm", "--nodes", "2", "--partition", "debug",
                          "--time", "10"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Slurm job" in out.stdout, out.stdout + out.stderr
    cluster = monarch_nb.connect("slurm-cli")
    job_id = job_of(cluster)
    assert scontrol_job(job_id)["TimeLimit"] == "00:10:00"
    assert [h["node"] for h in cluster.health()["hosts"]] == NODES
    cluster.disconnect()
    out = subprocess.run([*cli, "cluster", "stop", "slurm-cli"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert job_ended(job_id)


def test_the_magic_starts_a_slurm_cluster_in_a_notebook(started):
    from kernels import CellError, Kernel

    started.append("slurm-magic")
    kernel = Kernel("python3", env={"MONARCH_NB_CLUSTER": "none"})
    try:
        out = kernel.run("%load_ext monarch_nb\n%monarch start slurm-magic --slurm --nodes 2 --partition debug")
        assert "is up (2 host(s), Slurm job" in out, out
        out = kernel.run("%monarch procs p --per-host gpus=1\nprint(sorted(p.extent.items()))")
        assert "[('gpus', 1), ('hosts', 2)]" in out, out
        with pytest.raises(CellError) as info:  # Slurm options without --slurm
            kernel.run("%monarch start other --nodes 2")
        assert info.value.ename == "UsageError" and "add --slurm" in info.value.evalue
        job_id = kernel.run("import monarch_nb\nprint(monarch_nb.connect('slurm-magic').info()['allocator']['job_id'])")
        kernel.run("%monarch stop slurm-magic")
        assert job_ended(job_id.strip())
    finally:
        kernel.shutdown()


def test_stopping_a_slurm_cluster_whose_hub_died_cancels_its_job(started):
    started.append("slurm-orphan")
    cluster = Cluster.start("slurm-orphan", allocator=SlurmAllocator(nodes=2, start_timeout=60), grace_s=60)
    job_id = job_of(cluster)
    path = cluster.path
    os.kill(cluster._info["hub_pid"], signal.SIGKILL)
    # Left alone, the agents would keep the job running for the grace period (60 s).
    out = subprocess.run([sys.executable, "-m", "monarch_nb.cli", "cluster", "stop", "slurm-orphan"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert wait_until(lambda: job_ended(job_id), 15), scontrol_job(job_id)
    assert wait_until(lambda: not job_steps_alive(job_id) and not cluster_processes(path), 10)


def test_a_slurm_job_gives_named_meshes_of_its_batch_jobs_nodes_and_kill_ends_it():
    from monarch_nb.job import SlurmJob

    job = SlurmJob({"trainers": 1, "evaluators": 1}, partition="debug", exclusive=False, job_start_timeout=60)
    state = job.state(cached_path=None)
    path, job_id = job._cluster.path, job_of(job._cluster)
    assert scontrol_job(job_id)["JobName"] == "monarch_job"
    trainers = state.trainers.spawn_procs(per_host={"gpus": 1}).spawn("job_trainers", Trainer)
    evaluators = state.evaluators.spawn_procs(per_host={"gpus": 1}).spawn("job_evaluators", Trainer)
    assert trainers.where.call_one().get(timeout=60)[:2] == ("n1", job_id)
    assert evaluators.where.call_one().get(timeout=60)[:2] == ("n2", job_id)
    job.kill()
    assert job_ended(job_id), scontrol_job(job_id)
    assert wait_until(lambda: not job_steps_alive(job_id) and not cluster_processes(path), 10), (
        job_steps_alive(job_id), cluster_processes(path))


class EnvReader(Actor):
    @endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)


def test_setup_lines_run_before_the_agents_and_mem_reaches_the_job(started):
    started.append("slurm-setup")
    allocator = SlurmAllocator(nodes=2, partition="debug", mem="1M", setup=["export MONARCH_NB_SETUP_RAN=yes"],
                               start_timeout=60)
    cluster = Cluster.start("slurm-setup", allocator=allocator)
    assert scontrol_job(job_of(cluster))["MinMemoryNode"] == "1M"
    readers = cluster.host_mesh().spawn_procs(per_host={"gpus": 1}).spawn("readers", EnvReader)
    assert readers.env.call("MONARCH_NB_SETUP_RAN").get(timeout=60).values() == ["yes", "yes"]
    cluster.stop()


class Stepper(Actor):
    """A replica group's stand-in trainer, saying which job it runs in."""

    def __init__(self):
        self.steps = 0

    @endpoint
    def step(self) -> tuple:
        self.steps += 1
        return self.steps, os.environ.get("SLURM_JOB_ID")


def test_replica_groups_run_in_a_slurm_job_each_and_a_cancelled_one_gets_a_new_job(started):
    from monarch_nb.ft import ReplicaGroups

    started.append("slurm-groups")
    cluster = Cluster.start("slurm-groups", hosts=1)  # the controller's host; the groups get jobs
    groups = ReplicaGroups(cluster.host_mesh(), "rg", Stepper, num_groups=2, per_group={"gpus": 1},
                           allocator=SlurmAllocator(nodes=1, start_timeout=60))
    try:
        jobs = [job_of_allocation(cluster, name) for name in ("rg_0_0", "rg_1_1")]
        assert [scontrol_job(j)["JobName"] for j in jobs] == ["monarch_nb-slurm-groups-rg_0_0",
                                                              "monarch_nb-slurm-groups-rg_1_1"]
        assert [groups.call("step")[i].values()[0][1] for i in range(2)] == jobs
        subprocess.run(["scancel", jobs[1]], check=True, timeout=30)
        assert wait_until(lambda: 1 not in groups.call("step"), 60), groups.status()
        assert groups.wait_healthy(120), groups.status()
        new_job = job_of_allocation(cluster, "rg_1_2")
        assert new_job not in jobs and job_ended(jobs[1])
        steps = groups.call("step")
        assert steps[0].values()[0][1] == jobs[0] and steps[1].values()[0][1] == new_job
        assert sorted(cluster.allocations) == ["rg_0_0", "rg_1_2"]
    finally:
        groups.stop()
    assert cluster.allocations == {} and job_ended(jobs[0]) and job_ended(new_job)
    cluster.stop()


def job_of_allocation(cluster: Cluster, name: str) -> str:
    return cluster.info()["allocations"][name]["allocator"]["job_id"]


def test_stopping_a_cluster_whose_hub_died_cancels_the_jobs_of_its_added_allocations(started):
    started.append("slurm-added-orphan")
    cluster = Cluster.start("slurm-added-orphan", hosts=1)
    cluster.allocate("more", allocator=SlurmAllocator(nodes=1, start_timeout=60))
    job_id = job_of_allocation(cluster, "more")
    os.kill(cluster._info["hub_pid"], signal.SIGKILL)
    done = subprocess.run([sys.executable, "-m", "monarch_nb.cli", "cluster", "stop", "slurm-added-orphan"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert wait_until(lambda: job_ended(job_id), 30), scontrol_job(job_id)


def queued_job(name: str) -> str:
    """The id of the Slurm job named ``name`` (waiting in the queue), or ``""``."""
    return subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True,
                          timeout=30).stdout.strip()


def test_an_interrupted_allocate_gives_its_queued_job_back_and_frees_the_name(started):
    import threading

    started.append("slurm-added-ctrlc")
    cluster = Cluster.start("slurm-added-ctrlc", hosts=1)
    queued = SlurmAllocator(nodes=1, start_timeout=300, extra_sbatch_args=["--begin=now+3600"])
    jobs: list[str] = []

    def ctrl_c_once_queued():
        if wait_until(lambda: jobs.append(queued_job("monarch_nb-slurm-added-ctrlc-q")) or jobs[-1], 60):
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c_once_queued, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        cluster.allocate("q", allocator=queued)
    assert job_ended(jobs[-1]), scontrol_job(jobs[-1])  # not left in the queue for its start timeout
    assert cluster.allocations == {}
    assert len(cluster.allocate("q", hosts=1).spawn_procs().spawn("g", Trainer).say_hello.call("x").get(
        timeout=60)) == 1  # the name is free again
    assert {h["state"] for h in cluster.health()["hosts"]} == {"healthy"}
    cluster.stop()


def _queued_then_hub_killed(cluster: Cluster) -> str:
    """Allocate "q" on ``cluster`` (a job held in the queue for an hour) on a thread, and
    SIGKILL the hub once the job is queued; the job's id, once that allocate failed
    saying the hub is gone."""
    import threading

    name = f"monarch_nb-{cluster.path.name}-q"
    queued = SlurmAllocator(nodes=1, start_timeout=300, extra_sbatch_args=["--begin=now+3600"])
    errors: list[BaseException] = []

    def allocate():
        try:
            cluster.allocate("q", allocator=queued)
        except ClusterError as e:
            errors.append(e)

    waiting = threading.Thread(target=allocate)
    waiting.start()
    assert wait_until(lambda: queued_job(name), 60)
    job_id = queued_job(name)
    os.kill(cluster._info["hub_pid"], signal.SIGKILL)
    waiting.join(60)
    assert errors and "gone" in str(errors[0]), errors
    return job_id


def test_a_recovered_hub_ends_an_allocation_that_was_still_in_the_queue(started):
    from monarch_nb.client.runtime import runtime

    started.append("slurm-added-queued")
    job_id = _queued_then_hub_killed(Cluster.start("slurm-added-queued", hosts=1))
    runtime().cluster = None
    recovered = Cluster.recover("slurm-added-queued")
    assert wait_until(lambda: job_ended(job_id), 30), scontrol_job(job_id)  # else queued until the cluster stops
    assert recovered.allocations == {}
    assert {h["state"] for h in recovered.health()["hosts"]} == {"healthy"}
    recovered.stop()


def test_a_recovered_hub_ends_an_allocation_whose_job_its_predecessor_submitted_but_never_recorded(
        started, tmp_path, monkeypatch):
    # The hub dies between sbatch and the state file's write of the job's id (here: while
    # its sbatch, a wrapper, still runs after submitting). Its successor found no such
    # allocation, or one with no job, and the job stayed queued; CI once lost this race in
    # the test above.
    import shutil

    from monarch_nb.client.runtime import runtime

    held = tmp_path / "held.pid"
    wrapper = tmp_path / "bin" / "sbatch"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho $$ > "{held}"\n{shutil.which("sbatch")} "$@"\nexec sleep 120\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")  # the hub's, as it starts
    started.append("slurm-added-unrecorded")
    cluster = Cluster.start("slurm-added-unrecorded", hosts=1)
    monkeypatch.undo()
    try:
        job_id = _queued_then_hub_killed(cluster)  # its sbatch has not returned: no job id saved
        runtime().cluster = None
        recovered = Cluster.recover("slurm-added-unrecorded")
        assert wait_until(lambda: job_ended(job_id), 30), scontrol_job(job_id)
        assert recovered.allocations == {}
        recovered.stop()
    finally:
        if held.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(held.read_text()), signal.SIGKILL)


def test_an_allocation_of_more_nodes_than_the_partition_has_is_refused_at_once(started):
    started.append("slurm-added-too-big")
    cluster = Cluster.start("slurm-added-too-big", hosts=1)
    with pytest.raises(ClusterError, match=r"nodes=3\): the default partition has 2 node\(s\).*at most 2"):
        cluster.allocate("big", allocator=SlurmAllocator(nodes=3, start_timeout=300))  # not queued for 300 s
    assert not queued_job("monarch_nb-slurm-added-too-big-big") and cluster.allocations == {}
    cluster.stop()
