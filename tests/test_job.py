"""The job API (Monarch's ``monarch.job``): a job's named host meshes come from one
monarch_nb cluster it owns, and killing the job ends every process of it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import monarch_nb
from monarch_nb.actor import Actor, endpoint
from monarch_nb.client.runtime import runtime
from monarch_nb.job import JobState, LocalJob, LoginJob, ProcessJob, SSHJob, SlurmJob, job_load, job_loads

from conftest import cluster_processes, pids_alive, wait_until


class Where(Actor):
    @endpoint
    def pids(self) -> tuple[int, int]:
        """This proc's pid and its host agent's."""
        return os.getpid(), os.getppid()


@pytest.fixture
def jobs():
    """Jobs a test makes; each is killed afterwards and none may leave a process."""
    made: list = []
    yield made
    paths = [job._running._cluster.path for job in made if job.active and getattr(job._running, "_cluster", None)]
    for job in made:
        job.kill()
    assert wait_until(lambda: not any(cluster_processes(p) for p in paths), 10)


def test_a_one_host_job_spawns_procs_whose_actors_answer(jobs):
    job = ProcessJob({"hosts": 1})
    jobs.append(job)
    state = job.state(cached_path=None)
    assert isinstance(state, JobState) and dict(state.hosts.extent) == {"hosts": 1}
    procs = state.hosts.spawn_procs(per_host={"gpus": 2})
    pids = procs.spawn("where", Where).pids.call().get(timeout=30)
    assert dict(pids.extent) == {"hosts": 1, "gpus": 2}
    assert len({pid for pid, _ in pids.values()}) == 2


def test_named_meshes_are_runs_of_distinct_hosts_in_the_order_given(jobs):
    job = ProcessJob({"trainers": 2, "dataloaders": 1})
    jobs.append(job)
    state = job.state(cached_path=None)
    assert dict(state.trainers.extent) == {"hosts": 2} and dict(state.dataloaders.extent) == {"hosts": 1}
    agents = {}
    for name in ("trainers", "dataloaders"):
        procs = getattr(state, name).spawn_procs(per_host={"gpus": 1}, name=f"{name}_procs")
        agents[name] = [agent for _, agent in procs.spawn(f"{name}_where", Where).pids.call().get(timeout=30).values()]
    assert len(set(agents["trainers"])) == 2  # one host agent per host
    assert not set(agents["trainers"]) & set(agents["dataloaders"])


def test_a_mesh_name_the_job_lacks_is_an_error_listing_its_meshes(jobs):
    job = ProcessJob({"trainers": 1})
    jobs.append(job)
    with pytest.raises(AttributeError, match="'learners' is not a host mesh of this job; its meshes: trainers"):
        job.state(cached_path=None).learners


def test_kill_ends_every_process_of_the_job():
    job = ProcessJob({"hosts": 2})
    state = job.state(cached_path=None)
    path = job._cluster.path
    procs = state.hosts.spawn_procs(per_host={"gpus": 2})
    pids = procs.spawn("where", Where).pids.call().get(timeout=30).values()
    every = {pid for pair in pids for pid in pair}
    assert len(every) == 6 and cluster_processes(path)
    job.kill()
    assert not job.active and job.apply_id is None
    assert pids_alive(every) == [] and cluster_processes(path) == []
    assert not path.exists()


def test_state_applies_once_and_kill_then_state_allocates_anew(jobs):
    job = ProcessJob({"hosts": 1})
    jobs.append(job)
    first = job.state(cached_path=None).hosts
    apply_id = job.apply_id
    assert job.state(cached_path=None).hosts._hosts == first._hosts and job.apply_id == apply_id
    job.kill()
    job.state(cached_path=None)
    assert job.active and job.apply_id != apply_id


def test_a_job_cached_to_a_file_is_reused_by_the_same_spec_here_and_in_another_process(jobs, tmp_path):
    cache = str(tmp_path / ".monarch" / "job_state.pkl")
    first = ProcessJob({"hosts": 2})
    jobs.append(first)
    hosts = first.state(cached_path=cache).hosts
    procs = hosts.spawn_procs(per_host={"gpus": 1}, name="cached_procs")
    agents = {agent for _, agent in procs.spawn("where", Where).pids.call().get(timeout=30).values()}

    again = ProcessJob({"hosts": 2})
    assert again.state(cached_path=cache).hosts._hosts == hosts._hosts
    assert again.apply_id == first.apply_id

    script = textwrap.dedent(f"""
        import os
        from monarch_nb.actor import Actor, endpoint
        from monarch_nb.job import ProcessJob

        class Where(Actor):
            @endpoint
            def agent(self) -> int:
                return os.getppid()

        hosts = ProcessJob({{"hosts": 2}}).state(cached_path={cache!r}).hosts
        procs = hosts.spawn_procs(per_host={{"gpus": 1}}, name="from_elsewhere")
        print(sorted(procs.spawn("where_elsewhere", Where).agent.call().get(timeout=30).values()))
        procs.stop()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == str(sorted(agents))  # the same host agents


def test_a_cached_job_that_does_not_fit_the_spec_is_killed_and_replaced(jobs, tmp_path):
    cache = str(tmp_path / "job_state.pkl")
    small = ProcessJob({"hosts": 1})
    small.state(cached_path=cache)
    small_path = small._cluster.path
    big = ProcessJob({"hosts": 2})
    jobs.append(big)
    assert dict(big.state(cached_path=cache).hosts.extent) == {"hosts": 2}
    assert wait_until(lambda: not cluster_processes(small_path), 10)
    assert job_load(cache).apply_id == big.apply_id


def test_a_job_pickles_without_its_connection_and_reconnects_by_name(jobs):
    job = ProcessJob({"hosts": 1})
    jobs.append(job)
    hosts = job.state(cached_path=None).hosts
    copy = job_loads(job.dumps())
    assert copy.active and copy._cluster is None
    assert copy.state(cached_path=None).hosts._hosts == hosts._hosts


def test_a_job_given_a_cluster_name_runs_as_that_retained_cluster_and_leaves_this_host_alone(jobs):
    before = runtime().cluster
    job = ProcessJob({"hosts": 2}, cluster="job-retained")
    jobs.append(job)
    job.state(cached_path=None)
    listed = {c["name"]: c for c in monarch_nb.list_clusters()}
    assert not listed["job-retained"]["ephemeral"] and len(listed["job-retained"]["info"]["hosts"]) == 2
    assert runtime().cluster is before
    job.kill()
    assert "job-retained" not in {c["name"] for c in monarch_nb.list_clusters()}


class HereJob(LoginJob):
    """A login job whose hosts' command prefix is empty: each agent runs here."""

    def _command_prefix(self, host: str) -> list[str]:
        return []


def test_a_login_job_starts_one_agent_per_named_host_through_its_command_prefix(jobs):
    job = HereJob(bind="127.0.0.1")
    job.add_mesh("workers", ["node-a", "node-b"])
    jobs.append(job)
    hosts = job.state(cached_path=None).workers
    assert dict(hosts.extent) == {"hosts": 2}
    procs = hosts.spawn_procs(per_host={"gpus": 1}, name="login_procs")
    agents = [agent for _, agent in procs.spawn("login_where", Where).pids.call().get(timeout=30).values()]
    assert len(set(agents)) == 2


def test_local_job_gives_this_host_under_every_name(jobs):
    job = LocalJob(hosts=("trainers", "evaluators"))
    state = job.state(cached_path=None)
    assert len(state.trainers) == len(state.evaluators) == 1
    assert state.trainers._hosts == state.evaluators._hosts


@pytest.mark.parametrize("make, message", [
    (lambda: ProcessJob({"hosts": 0}), "mesh 'hosts' has 0 hosts"),
    (lambda: ProcessJob({"my hosts": 1}), "give an identifier"),
    (lambda: ProcessJob(["hosts"]), "give a dict of mesh name"),
])
def test_bad_meshes_are_refused_before_anything_starts(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


@pytest.mark.parametrize("make, message", [
    (lambda: ProcessJob({"hosts": 1}, env={"A": "1"}), "no env="),
    (lambda: SlurmJob({"hosts": 1}, ntasks_per_node=8), "ntasks_per_node"),
    (lambda: SlurmJob({"hosts": 1}, out_of_cluster=True), "out_of_cluster"),
    (lambda: SSHJob(transport="metatls"), "transport='metatls'"),
    (lambda: ProcessJob({"hosts": 1}).enable_telemetry(), "no telemetry"),
])
def test_monarch_options_monarch_nb_lacks_say_so(make, message):
    with pytest.raises(NotImplementedError, match=message):
        make()


def test_a_login_job_without_a_command_prefix_says_what_to_give():
    class Handmade(LoginJob):
        def _start_host(self, host):  # Monarch's hook
            raise AssertionError("never called")

    job = Handmade(bind="127.0.0.1")
    job.add_mesh("hosts", ["a"])
    with pytest.raises(NotImplementedError, match=r"_command_prefix\(host\)"):
        job.state(cached_path=None)
    assert not job.active


def test_a_login_job_to_a_host_without_a_route_asks_for_bind():
    job = HereJob()
    job.add_mesh("hosts", ["no-such-host.invalid"])
    with pytest.raises(ValueError, match="no route to host 'no-such-host.invalid'.*bind="):
        job.state(cached_path=None)


BATCH_CLIENT = textwrap.dedent("""
    import sys
    from monarch_nb.job import {kind}

    state = {kind}({spec}).state()
    hosts = getattr(state, {name!r})
    procs = hosts.spawn_procs(per_host={{"gpus": 1}})
    print("batch hosts", dict(hosts.extent), "procs", dict(procs.extent))
    procs.stop()
""")


def _batch_output(job) -> tuple[int, str, str]:
    code = job.process.wait(timeout=120)
    logs = [open(os.path.join(job._log_dir, f)).read() for f in ("stdout.log", "stderr.log")]
    return code, logs[0], logs[1]


def test_a_batch_client_script_gets_the_applied_local_jobs_host_meshes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(BATCH_CLIENT.format(kind="LocalJob", spec="", name="batch_hosts"))
    job = LocalJob(("batch_hosts",))
    job.apply(client_script="train.py")
    code, out, err = _batch_output(job)
    assert code == 0, err
    assert "batch hosts {} procs {'gpus': 1}" in out  # the applied job's name, on this host


def test_a_batch_client_script_uses_the_jobs_retained_cluster_which_ends_with_it(jobs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(BATCH_CLIENT.format(kind="ProcessJob", spec='{"other": 1}', name="trainers"))
    job = ProcessJob({"trainers": 2}, cluster="job-batch")
    jobs.append(job)
    job.apply(client_script="train.py")
    path = job._cluster.path
    code, out, err = _batch_output(job)
    assert code == 0, err
    assert "batch hosts {'hosts': 2} procs {'hosts': 2, 'gpus': 1}" in out  # the applied job's spec, not the script's
    assert wait_until(lambda: not cluster_processes(path), 20)  # the job ended with its batch client
    assert "job-batch" not in {c["name"] for c in monarch_nb.list_clusters()}


def test_batch_mode_refuses_a_job_whose_allocation_ends_with_this_process(tmp_path):
    (tmp_path / "train.py").write_text("")
    with pytest.raises(ValueError, match="needs a retained cluster.*cluster='NAME'"):
        ProcessJob({"hosts": 1}).apply(client_script=str(tmp_path / "train.py"))


def test_batch_mode_names_a_missing_script_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="no_such.py"):
        LocalJob().apply(client_script="no_such.py")
    assert not (tmp_path / ".monarch").exists()
