"""Monarch's host mesh and proc mesh surface on real procs: owned vs reference host
meshes, ``async with``, ``spawn_procs(bootstrap=..., proc_bind=...)``,
``with_python_executable`` through recursive spawns, ``logging_option(level=...)``,
``shutdown_context()``, ``Actor.logger`` in ``__cleanup__``, ``SPMDActor``."""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import stat
import subprocess
import sys
import textwrap

import pytest

from conftest import pids_alive, wait_until
from monarch_nb.actor import Actor, ActorError, endpoint, this_host, this_proc
from monarch_nb.spmd import SPMDActor
from sample_actors import Counter

# -- host meshes ---------------------------------------------------------------------


def test_slices_and_unpickled_host_meshes_are_references_that_cannot_shut_down(cluster):
    hosts = cluster.host_mesh()
    for reference in (hosts.slice(hosts=0), pickle.loads(pickle.dumps(hosts))):
        with pytest.raises(RuntimeError, match="reference instead of owned"):
            reference.shutdown()
        assert reference._inner_host_mesh is not None
    assert hosts.initialized.get() is True


def test_async_with_shuts_the_host_mesh_down_once(cluster):
    async def use():
        async with cluster.this_host() as hosts:
            procs = hosts.spawn_procs(per_host={"gpus": 1}, name="asyncwith")
            pids = procs.pids
        return hosts, pids

    hosts, pids = asyncio.run(use())
    assert hosts._inner_host_mesh is None and wait_until(lambda: not pids_alive(pids), 10)
    with pytest.raises(RuntimeError, match="already been shut down"):
        hosts.spawn_procs()
    with pytest.raises(RuntimeError, match="already been shut down"):
        hosts.shutdown()


_kept = None


def spawn_a_kept_counter() -> None:
    """A bootstrap: spawns an actor on its own proc that must outlive the bootstrap."""
    global _kept
    _kept = this_proc().spawn("kept", Counter, 40)
    _kept.incr.call_one(2).get()


async def async_bootstrap() -> None:
    global _kept
    _kept = this_proc().spawn("kept", Counter, 40)
    await _kept.incr.call_one(2)


def failing_bootstrap() -> None:
    raise RuntimeError("bootstrap says no")


class KeptReader(Actor):
    @endpoint
    def kept(self) -> int:
        import test_monarch_meshes

        return test_monarch_meshes._kept.get.call_one().get()

    @endpoint
    def affinity(self) -> list[int]:
        return sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize("bootstrap", [spawn_a_kept_counter, async_bootstrap])
def test_bootstrap_runs_in_every_proc_before_spawn_procs_returns(host, bootstrap):
    procs = host.spawn_procs(per_host={"gpus": 2}, bootstrap=bootstrap, name="booted")
    try:
        assert procs.initialized.get() is True
        assert procs.spawn("reader", KeptReader).kept.call().get().values() == [42, 42]
    finally:
        procs.stop()


def test_a_failing_bootstrap_fails_initialized_not_spawn_procs(host):
    procs = host.spawn_procs(bootstrap=failing_bootstrap, name="badboot")
    try:
        with pytest.raises(ActorError, match="bootstrap says no"):
            procs.initialized.get()
    finally:
        procs.stop()


def test_proc_bind_pins_each_proc_of_a_host_to_its_cpus(host):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    with pytest.raises(ValueError, match=r"proc_bind length \(1\) must equal procs_per_host \(2\)"):
        host.spawn_procs(per_host={"gpus": 2}, proc_bind=[{"cpus": "0"}])
    with pytest.raises(ValueError, match="membind"):
        host.spawn_procs(per_host={"gpus": 1}, proc_bind=[{"membind": "0"}])
    with pytest.raises(ValueError, match="a list such as"):
        host.spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpus": "first"}])
    procs = host.spawn_procs(per_host={"gpus": 2}, proc_bind=[{"cpus": str(cpus[0])}, {"cpus": str(cpus[1])}],
                             name="bound")
    try:
        assert procs.spawn("reader", KeptReader).affinity.call().get().values() == [[cpus[0]], [cpus[1]]]
    finally:
        procs.stop()


class Wrapped(Actor):
    @endpoint
    def marker(self) -> str:
        return os.environ.get("WRAPPER_PID", "")

    @endpoint
    def spawn_inner(self) -> "Wrapped":
        return this_host().spawn_procs(per_host={"procs": 1}).spawn("inner", Wrapped)


def test_with_python_executable_also_runs_procs_that_actors_spawn(host, tmp_path):
    wrapper = tmp_path / "python_wrapper"
    wrapper.write_text(f'#!/bin/sh\nexport WRAPPER_PID=$$\nexec {sys.executable} "$@"\n')
    wrapper.chmod(stat.S_IRWXU)
    procs = host.with_python_executable(str(wrapper)).spawn_procs(per_host={"procs": 1}, name="wrapped")
    try:
        outer = procs.spawn("outer", Wrapped)
        first = outer.marker.call_one().get()
        inner = outer.spawn_inner.call_one().get()
        second = inner.marker.call_one().get()
        assert first and second and first != second  # the wrapper ran again for the inner proc
    finally:
        procs.stop()


# -- proc meshes -----------------------------------------------------------------------


class RootLevel(Actor):
    @endpoint
    def level(self) -> int:
        return logging.getLogger().level


def test_logging_option_sets_the_root_log_level_in_every_proc(procs4):
    levels = procs4.spawn("levels", RootLevel)
    procs4.logging_option(level=logging.INFO).get()
    assert levels.level.call().get().values() == [logging.INFO] * 4
    procs4.logging_option(level=logging.WARNING).get()
    assert levels.level.call().get().values() == [logging.WARNING] * 4


class Tidy(Actor):
    def __init__(self, counter):
        self.counter = counter

    @endpoint
    def ping(self) -> None:
        pass

    def __cleanup__(self, exc) -> None:
        self.logger.info("cleaning up")  # Monarch's Actor.logger
        self.counter.incr.call_one().get()


def test_cleanup_may_use_the_actor_logger(procs4):
    counter = procs4.slice(gpus=0).spawn("cleancount", Counter)
    tidy = procs4.slice(gpus=1).spawn("tidy", Tidy, counter)
    tidy.ping.call_one().get()
    tidy.stop().get()
    assert wait_until(lambda: counter.get.call_one().get() == 1, 10)


class EnvReader(Actor):
    @endpoint
    def read(self) -> dict:
        return {k: os.environ.get(k, "") for k in ("RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "ROLE_NAME")}


def test_spmd_actor_sets_the_torch_elastic_variables(host):
    procs = host.spawn_procs(per_host={"hosts": 2, "gpus": 2}, name="spmdprocs")
    try:
        procs.spawn("spmd", SPMDActor).setup_env.call("localhost", 29500).get()
        # read by another actor: the variables are the proc's (os.environ)
        ranks = procs.spawn("readenv", EnvReader).read.call().get().values()
        assert [r["RANK"] for r in ranks] == ["0", "1", "2", "3"]
        assert [r["GROUP_RANK"] for r in ranks] == ["0", "0", "1", "1"]
        assert {r["LOCAL_WORLD_SIZE"] for r in ranks} == {"2"} and {r["ROLE_NAME"] for r in ranks} == {"rank"}
    finally:
        procs.stop()


def test_shutdown_context_ends_the_scripts_cluster_and_its_procs(tmp_path):
    script = textwrap.dedent("""
        from monarch_nb.actor import shutdown_context, this_host
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        print(" ".join(map(str, procs.pids)), flush=True)
        assert shutdown_context().get() is None and shutdown_context().get() is None
        print("done", flush=True)
        input()  # stay alive: the procs must end now, not at exit
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    client = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env, cwd=tmp_path)
    try:
        pids = [int(p) for p in client.stdout.readline().split()]
        assert client.stdout.readline().strip() == "done"
        assert len(pids) == 2 and wait_until(lambda: not pids_alive(pids), 10)
    finally:
        client.communicate("\n", timeout=30)
