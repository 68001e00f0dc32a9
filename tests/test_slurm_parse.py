"""Reading Slurm's output: hostlists, ``scontrol show`` records, ``squeue`` lines and
``sbatch`` answers.

Fixtures in tests/data/slurm: the ``22.05`` files were recorded from the Debian Slurm
that CI runs (.ci/setup.d/30-slurm.sh); the others follow the layouts of other
versions' ``scontrol``/``squeue`` (``Name=`` before 20.x, ``SchedNodeList``,
``ReqTRES`` and ``TresPerNode`` later, one-line ``-o`` records, job names and paths
with spaces, reasons with node lists).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from monarch_nb.allocators import slurm_parse as sp

DATA = Path(__file__).parent / "data" / "slurm"


def read(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize("hostlist, names", [
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("n[1-2]", ["n1", "n2"]),
    ("snowflake0", ["snowflake0"]),
    ("a1,b[2-3],c", ["a1", "b2", "b3", "c"]),
    ("gpu[8-10]-ib", ["gpu8-ib", "gpu9-ib", "gpu10-ib"]),
    ("rack[1-2]-gpu[1-2]", ["rack1-gpu1", "rack1-gpu2", "rack2-gpu1", "rack2-gpu2"]),
    ("dgx[001-003],cpu[9-11]", ["dgx001", "dgx002", "dgx003", "cpu9", "cpu10", "cpu11"]),
    ("node[7]", ["node7"]),
    ("", []),
    ("(null)", []),
])
def test_hostlists_expand_in_slurm_order(hostlist, names):
    assert sp.expand_hostlist(hostlist) == names


@pytest.mark.parametrize("bad, problem", [
    ("node[01-04", "'\\[' without '\\]'"), ("node01-04]", "'\\]' without '\\['"),
    ("node[4-1]", "1 < 4"), ("node[a-b]", "use N or N-M"), ("n[[1-2]]", "nested"),
])
def test_bad_hostlists_are_refused_with_the_problem(bad, problem):
    with pytest.raises(ValueError, match=problem):
        sp.expand_hostlist(bad)


def test_a_running_job_record_from_slurm_24_one_line_form():
    running, cancelled = sp.parse_scontrol(read("scontrol_show_job_24.05_oneline.txt"))
    assert sp.job_state(running) == ("RUNNING", "")
    assert sp.expand_hostlist(running["NodeList"]) == ["node01", "node02", "node03", "node04", "node07"]
    assert running["AllocTRES"] == "cpu=5,mem=5G,node=5,billing=5"  # split at the first '='
    assert running["AllocNode:Sid"] == "head:12" and running["CPUs/Task"] == "1"
    assert sp.job_state(cancelled) == ("CANCELLED", "")
    assert sp.expand_hostlist(cancelled["NodeList"]) == ["rack1-gpu1", "rack1-gpu2", "rack2-gpu1", "rack2-gpu2"]


def test_a_pending_job_with_spaces_in_its_name_and_paths_from_slurm_23():
    (job,) = sp.parse_scontrol(read("scontrol_show_job_23.11_pending.txt"))
    assert job["JobName"] == "train run 7"
    assert job["Command"] == "/home/alice/my jobs/run.sh" and job["WorkDir"] == "/home/alice/my jobs"
    state, reason = sp.job_state(job)
    assert state == "PENDING" and reason == "ReqNodeNotAvail,_UnavailableNodes:gpu[01-02,07]"
    assert job["NodeList"] == "" and sp.expand_hostlist(job["SchedNodeList"]) == ["gpu03", "gpu04"]
    assert job["TresPerNode"] == "gres/gpu:4"


def test_a_timed_out_job_from_slurm_20():
    (job,) = sp.parse_scontrol(read("scontrol_show_job_20.11_timeout.txt"))
    assert sp.job_state(job) == ("TIMEOUT", "TimeLimit") and "TIMEOUT" in sp.FINAL_STATES
    assert sp.expand_hostlist(job["NodeList"]) == ["dgx001", "dgx002", "dgx003", "dgx004"]
    assert job["MailUser"] == "bob"


def test_old_slurm_says_name_where_later_ones_say_jobname():
    (job,) = sp.parse_scontrol(read("scontrol_show_job_2.x_completed.txt"))
    assert job["JobId"] == "71701" and job["JobName"] == "hostname"
    assert sp.job_state(job) == ("COMPLETED", "") and job["NodeList"] == "snowflake0"
    assert job["ReqS:C:T"] == "1:1:1"


def test_records_recorded_from_the_ci_slurm_22_05():
    (pending,) = sp.parse_scontrol(read("scontrol_show_job_22.05_pending.txt"))
    assert pending["JobName"] == "monarch_nb-pending job"
    assert sp.job_state(pending) == ("PENDING", "BeginTime") and pending["NodeList"] == ""
    assert "PENDING" not in sp.FINAL_STATES
    (cancelled,) = sp.parse_scontrol(read("scontrol_show_job_22.05_oneline_cancelled.txt"))
    assert sp.job_state(cancelled) == ("CANCELLED", "") and cancelled["NodeList"] == "n1"
    nodes = sp.parse_scontrol(read("scontrol_show_node_22.05.txt"))
    assert [n["NodeName"] for n in nodes] == ["n1", "n2"]
    assert {n["NodeAddr"] for n in nodes} == {"127.0.0.1"} and nodes[0]["OS"].startswith("Linux ")
    (partition,) = sp.parse_scontrol(read("scontrol_show_partition_22.05.txt"))
    assert partition["Default"] == "YES" and sp.expand_hostlist(partition["Nodes"]) == ["n1", "n2"]


def test_job_states_with_flags_are_cut_to_their_base_name():
    assert sp.job_state({"JobState": "CANCELLED by 1000", "Reason": "None"}) == ("CANCELLED", "")
    assert sp.job_state({"JobState": "RUNNING+CONFIGURING"}) == ("RUNNING", "")
    assert sp.job_state({}) == ("UNKNOWN", "")


FIELDS = ["id", "name", "state", "reason", "nodes"]  # squeue -h -o '%i|%j|%T|%r|%N'


def test_squeue_lines_recorded_from_the_ci_slurm():
    rows = sp.parse_squeue(read("squeue_22.05.txt"), FIELDS)
    assert [(r["id"], r["state"], r["reason"], r["nodes"]) for r in rows][-2:] == [
        ("4", "PENDING", "BeginTime", ""), ("5", "RUNNING", "None", "n1")]
    assert rows[0]["name"] == "monarch_nb-pending job"


def test_squeue_lines_skip_warnings_and_keep_reasons_with_spaces():
    rows = sp.parse_squeue(read("squeue_23.02.txt"), FIELDS)
    assert [r["id"] for r in rows] == ["99120", "99122", "99123", "99124"]
    assert rows[2]["reason"] == "ReqNodeNotAvail, UnavailableNodes:node[08-09]"
    assert sp.expand_hostlist(rows[0]["nodes"]) == ["node01", "node02", "node03", "node04", "node07"]


@pytest.mark.parametrize("text, job_id", [
    ("12\n", "12"), ("4410923;cluster-a\n", "4410923"), ("Submitted batch job 77\n", "77"),
    ("sbatch: warning: can't honor --ntasks-per-node\n981\n", "981"),
])
def test_sbatch_answers_give_the_job_id(text, job_id):
    assert sp.parse_sbatch(text) == job_id


def test_sbatch_without_a_job_id_is_an_error_quoting_it():
    with pytest.raises(ValueError, match="invalid partition"):
        sp.parse_sbatch("sbatch: error: invalid partition specified: nope\n")


@pytest.mark.parametrize("text, version", [("slurm 23.02.7\n", (23, 2)), ("slurm-wlm 22.05.8\n", (22, 5)),
                                           ("slurm 20.02.1", (20, 2)), ("srun: command not understood", None)])
def test_srun_version_is_read_for_the_overlap_decision(text, version):
    assert sp.parse_version(text) == version
