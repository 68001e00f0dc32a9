"""Monarch's remaining public names (issue 28 items 3 and 4): ``Future.as_asyncio()``,
``ValueMesh.get(rank)``, ``HostMesh.stream_logs``, ``monarch.job.exec_command``,
``monarch.rdma.is_ibverbs_available`` and its warning classes, and the names monarch_nb
leaves out raising ``NotImplementedError`` that names them (``as_endpoint``,
``exec_command(rank=...)``)."""

from __future__ import annotations

import asyncio

import pytest

from monarch_nb.actor import ActorError, Extent, ValueMesh, as_endpoint
from sample_actors import Counter, CustomError, Failing


def test_value_mesh_get_takes_a_row_major_rank():
    vm = ValueMesh(Extent({"hosts": 2, "gpus": 2}), ["a", "b", "c", "d"])
    assert [vm.get(r) for r in range(4)] == ["a", "b", "c", "d"]
    assert vm.slice(gpus=1).get(1) == "d"  # a slice's own ranks
    with pytest.raises(IndexError, match=r"rank 4 is not in this ValueMesh of 4 values \(ranks 0-3"):
        vm.get(4)
    with pytest.raises(TypeError, match=r"use item\(\*\*coords\)"):
        vm.get("gpus")  # type: ignore[arg-type]


def test_as_asyncio_needs_a_running_loop_and_leaves_the_future_usable(procs4):
    counters = procs4.spawn("remaining_asyncio", Counter)
    future = counters.slice(gpus=0).incr.call_one(5)
    with pytest.raises(RuntimeError, match="needs a running asyncio event loop"):
        future.as_asyncio()

    async def observe():
        first = future.as_asyncio()
        second = future.as_asyncio()  # each call a fresh loop-local future
        assert isinstance(first, asyncio.Future) and first is not second
        return await asyncio.wait_for(first, 60), await second

    assert asyncio.run(observe()) == (5, 5)
    assert future.get() == 5  # not consumed
    counters.stop()


def test_as_asyncio_of_a_pending_call_completes_with_its_value_on_the_loop(procs4):
    counters = procs4.spawn("remaining_pending", Counter)

    async def gather():
        futures = [counters.incr.call(1).as_asyncio() for _ in range(3)]
        meshes = await asyncio.wait_for(asyncio.gather(*futures), 60)
        return [sorted(vm.values()) for vm in meshes]

    assert asyncio.run(gather()) == [[1] * 4, [2] * 4, [3] * 4]
    counters.stop()


def test_as_asyncio_raises_the_calls_error(procs4):
    failing = procs4.spawn("remaining_failing", Failing)

    async def observe():
        return await asyncio.wait_for(failing.slice(gpus=0).fail_on.call_one([0], "custom").as_asyncio(), 60)

    with pytest.raises(ActorError) as raised:
        asyncio.run(observe())
    assert isinstance(raised.value.exception, CustomError)
    failing.stop()


def test_host_mesh_streams_logs_to_the_client(host):
    assert host.stream_logs is True


def test_as_endpoint_raises_not_implemented_naming_it():
    with pytest.raises(NotImplementedError, match="monarch_nb has no as_endpoint: .* decorate the method with @endpoint"):
        as_endpoint(Counter.incr)



def test_exec_command_gives_the_largest_return_code_prints_the_output_and_stops_its_procs(cluster, host, capsys):
    from monarch_nb.job import exec_command

    before = set(cluster.proc_meshes)
    assert exec_command(host, ["bash", "-c", "echo out-$((6 * 7)); echo err-1 >&2; exit 3"]).get(timeout=120) == 3
    captured = capsys.readouterr()
    assert "out-42" in captured.out and "err-1" in captured.err
    assert exec_command(host, ["true"]).get(timeout=120) == 0
    assert set(cluster.proc_meshes) == before  # the procs it spawned are stopped


def test_exec_command_runs_a_python_script_where_the_client_runs_with_env_and_output_dir(host, tmp_path, monkeypatch,
                                                                                          capsys):
    from monarch_nb.job import exec_command

    (tmp_path / "job.py").write_text("import os\nprint(os.environ['JOB_X'], os.getcwd())\n")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert exec_command(host, ["job.py"], env={"JOB_X": "seven"}, output_dir=str(out)).get(timeout=120) == 0
    assert (out / "stdout.txt").read_text().split() == ["seven", str(tmp_path)]
    assert "seven" not in capsys.readouterr().out  # to the files only


def test_exec_command_refuses_bad_selections_naming_them(host):
    from monarch_nb.job import exec_command

    with pytest.raises(NotImplementedError, match=r"monarch_nb has no HostMesh.flatten.*point="):
        exec_command(host, ["true"], rank=0)
    with pytest.raises(ValueError, match="rank= or point=, not both"):
        exec_command(host, ["true"], rank=0, point={"hosts": 0})
    with pytest.raises(ValueError, match="cmd is empty"):
        exec_command(host, [])


def test_rdma_says_there_is_no_ibverbs_and_has_monarchs_warning_classes():
    import monarch_nb.rdma as rdma

    assert rdma.is_ibverbs_available() is False
    assert rdma.is_rdma_available() is True  # a backend of its own is always there
    for name in ("RDMAReadTransferWarning", "RDMAWriteTransferWarning", "RDMATcpFallbackWarning"):
        assert issubclass(getattr(rdma, name), Warning) and name in rdma.__all__


def test_monarchs_names_that_monarch_nb_leaves_out_import_and_raise_not_implemented_naming_them():
    import monarch_nb.actor
    from monarch_nb.actor import config, get_meter  # a Monarch program's imports work
    from monarch_nb.job import shell

    with pytest.raises(NotImplementedError, match=r"monarch_nb has no monarch\.actor\.config: "):
        config.configure(enable_log_forwarding=True)
    with pytest.raises(NotImplementedError, match=r"monarch_nb has no monarch\.actor\.get_meter: telemetry"):
        get_meter("trainer")
    with pytest.raises(NotImplementedError, match=r"monarch_nb has no monarch\.job\.shell: .*exec_command"):
        shell()
    with pytest.raises(AttributeError, match="has no attribute 'not_a_monarch_name'"):
        monarch_nb.actor.not_a_monarch_name  # noqa: B018 - names Monarch lacks too stay AttributeErrors
