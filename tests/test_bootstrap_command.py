"""``spawn_procs(bootstrap_command=...)`` (Monarch's per-proc start command): its
environment reaches each proc, one command for all or one per rank from the proc's
point; what procs here cannot vary is refused naming it."""

from __future__ import annotations

import os
import sys

import pytest

from monarch_nb.actor import Actor, BootstrapCommand, Extent, default_bootstrap_cmd, endpoint
from monarch_nb.client.bootstrap_command import per_rank


class EnvReader(Actor):
    @endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)


def test_a_bootstrap_commands_env_reaches_every_proc_and_not_the_next_spawn(host):
    cmd = default_bootstrap_cmd().with_env({"TRAINER_ROLE": "policy"})
    procs = host.spawn_procs(per_host={"gpus": 2}, bootstrap_command=cmd)
    plain = host.spawn_procs(per_host={"gpus": 1})
    try:
        roles = procs.spawn("env_all", EnvReader).env.call("TRAINER_ROLE").get(timeout=60)
        assert list(roles.values()) == ["policy"] * 2
        assert plain.spawn("env_plain", EnvReader).env.call_one("TRAINER_ROLE").get(timeout=60) is None
    finally:
        procs.stop()
        plain.stop()


def test_a_bootstrap_command_function_gives_each_rank_its_own_env_from_its_point(host):
    def per_gpu(point) -> BootstrapCommand:
        return default_bootstrap_cmd().with_env({"CUDA_VISIBLE_DEVICES": str(point["gpus"])})

    procs = host.spawn_procs(per_host={"gpus": 2}, bootstrap_command=per_gpu)
    try:
        seen = procs.spawn("env_rank", EnvReader).env.call("CUDA_VISIBLE_DEVICES").get(timeout=60)
        assert [(point["gpus"], value) for point, value in seen.items()] == [(0, "0"), (1, "1")]
    finally:
        procs.stop()


def test_with_env_returns_a_changed_copy_and_leaves_the_command_alone():
    base = default_bootstrap_cmd()
    changed = base.with_env({"A": "1"}).with_env({"A": "2", "B": "3"})
    assert base.env == {} and changed.env == {"A": "2", "B": "3"}
    assert (changed.program, changed.args) == (sys.executable, ["-m", "monarch_nb.proc"])


def test_per_rank_envs_follow_the_new_meshes_row_major_ranks():
    python, envs = per_rank(lambda p: default_bootstrap_cmd().with_env({"R": str(p.rank), "H": str(p["hosts"])}),
                            Extent({"hosts": 2, "gpus": 2}))
    assert python == sys.executable
    assert envs == [{"R": "0", "H": "0"}, {"R": "1", "H": "0"}, {"R": "2", "H": "1"}, {"R": "3", "H": "1"}]


@pytest.mark.parametrize("command, error, message", [
    (BootstrapCommand(sys.executable, None, ["-m", "other.main"], {}), NotImplementedError,
     r"no spawn_procs\(bootstrap_command=\) with arg0=None, args=\['-m', 'other.main'\]"),
    (BootstrapCommand(sys.executable, "trainer", ["-m", "monarch_nb.proc"], {}), NotImplementedError, "arg0='trainer'"),
    (lambda p: BootstrapCommand(f"/py{p.rank}", None, ["-m", "monarch_nb.proc"], {}), NotImplementedError,
     "different interpreters"),
    (["python", "-m", "x"], TypeError, "takes a BootstrapCommand or a function of a Point"),
    (lambda p: "python", TypeError, "returned 'python', not a BootstrapCommand"),
])
def test_what_procs_here_cannot_vary_is_refused_naming_it(command, error, message):
    with pytest.raises(error, match=message):
        per_rank(command, Extent({"gpus": 2}))


def test_a_bad_command_is_refused_before_any_proc_starts(host):
    with pytest.raises(TypeError, match="takes a BootstrapCommand"):
        host.spawn_procs(per_host={"gpus": 1}, bootstrap_command=["python", "-m", "x"])
    with pytest.raises(TypeError, match="env maps variable names to strings"):
        default_bootstrap_cmd().with_env({"A": 1})
