"""Slurm options without a running job: ``job_script()``, ``--dry-run`` from the CLI and
the magic, and defaults from ``$MONARCH_NB_HOME/config.toml``. Needs Slurm's commands on
PATH (``.ci/setup.d/30-slurm.sh``), not its controller."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from monarch_nb import cluster_dir
from monarch_nb.allocators import base as allocators
from monarch_nb.allocators.slurm import SlurmAllocator

pytestmark = pytest.mark.skipif(shutil.which("sbatch") is None, reason="Slurm's commands are not installed")


@pytest.fixture
def config(tmp_path, monkeypatch):
    """Writes ``$MONARCH_NB_HOME/config.toml`` (a fresh home) from the text given."""
    monkeypatch.setenv("MONARCH_NB_HOME", str(tmp_path))

    def write(text: str) -> None:
        (tmp_path / "config.toml").write_text(text)

    return write


def directives(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_the_job_script_carries_every_option_and_runs_setup_before_the_agents(config):
    script = SlurmAllocator(nodes=2, partition="debug", time="1:00:00", mem="64G", gpus_per_node=8, account="proj",
                            setup=["module load cuda/12.4", "source venv/bin/activate"],
                            extra_sbatch_args=["--exclusive"]).job_script("train")
    assert script.startswith("#!/bin/bash\n")
    assert directives(script) == [
        "--job-name=monarch_nb-train", "--nodes=2", "--ntasks-per-node=1",
        f"--output={cluster_dir.cluster_path('train') / 'slurm-%j.out'}", f"--chdir={os.getcwd()}",
        "--partition=debug", "--time=1:00:00", "--mem=64G", "--gpus-per-node=8", "--account=proj", "--exclusive"]
    lines = script.splitlines()
    step = next(i for i, line in enumerate(lines) if line.startswith("exec srun "))
    assert lines[step - 2:step] == ["module load cuda/12.4", "source venv/bin/activate"]
    assert "HUB_ADDRESS" in lines[step] and sys.executable in lines[step]


def test_options_not_given_come_from_config_toml_under_dask_jobqueue_and_submitit_names(config):
    config('[slurm]\nqueue = "gpu"\nwalltime = "4:00:00"\nmemory = "32G"\naccount = "proj"\n'
           'slurm_setup = ["module load cuda"]\nstart_timeout = 60\n')
    allocator = SlurmAllocator(nodes=1, account="other")  # an argument wins over the file
    assert allocator.options["partition"] == "gpu" and allocator.options["time"] == "4:00:00"
    assert allocator.options["mem"] == "32G" and allocator.options["account"] == "other"
    assert allocator.setup == ["module load cuda"] and allocator.start_timeout_s == 60.0


def test_a_bad_config_names_the_file_and_the_setting(config):
    config('[slurm]\npartiton = "gpu"\n')
    with pytest.raises(ValueError, match=r"config\.toml: \[slurm\] has no setting 'partiton'"):
        SlurmAllocator()
    config('[slurm]\nqueue = "a"\npartition = "b"\n')
    with pytest.raises(ValueError, match="sets 'partition' twice"):
        SlurmAllocator()
    config("[slurm\n")
    with pytest.raises(ValueError, match=r"config\.toml"):
        SlurmAllocator()
    with pytest.raises(ValueError, match=r"setup='module load x': give a list"):
        SlurmAllocator(setup="module load x", defaults={})


def test_a_restored_allocator_keeps_its_options_whatever_the_config_says_now(config):
    allocator = SlurmAllocator(nodes=2, mem="8G", setup=["echo hi"])
    config('[slurm]\npartition = "later"\nmem = "1G"\n')
    restored = allocators.create(allocator.spec(), str(cluster_dir.cluster_path("x")), 10.0)  # as the hub does
    assert restored.options == allocator.options and restored.setup == ["echo hi"]


def test_the_cli_dry_run_prints_the_script_and_submits_nothing(config):
    config('[slurm]\nqueue = "debug"\n')
    out = subprocess.run([sys.executable, "-m", "monarch_nb.cli", "cluster", "start", "dry", "--slurm", "--nodes", "2",
                          "--mem", "4G", "--setup", "echo ready", "--dry-run"],
                         capture_output=True, text=True, timeout=120, env=os.environ)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("#!/bin/bash\n") and "nothing submitted" in out.stderr
    assert {"--partition=debug", "--nodes=2", "--mem=4G"} <= set(directives(out.stdout))
    assert "\necho ready\nexec srun " in out.stdout
    assert not cluster_dir.cluster_path("dry").exists()


def test_the_magic_dry_run_prints_the_script(config, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "monarch_nb")
        shell.run_line_magic("monarch", "start dry --slurm --nodes 2 --time 10 --dry-run")
    finally:
        shell.run_line_magic("unload_ext", "monarch_nb")
        InteractiveShell.clear_instance()
    out = capsys.readouterr().out
    assert "nothing submitted" in out and "#SBATCH --time=10" in out
    assert not cluster_dir.cluster_path("dry").exists()
