"""The actor API against a real local cluster: procs, adverbs, slicing, errors."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from monarch_nb.actor import (ActorError, Extent, MessageTooLarge, RemoteException, SerializationError,
                              SupervisionError, ValueMesh, current_rank, this_proc)
from conftest import pids_alive, wait_until
from monarch_nb.client import endpoint as endpoint_module
from monarch_nb.wire.mailbox import Mailbox
from monarch_nb.client.runtime import runtime
from sample_actors import (AsyncActor, AsyncCaller, AsyncWhere, BadInit, Caller, Counter, CustomError, Failing, Named,
                           NotAnActor, Rendezvous, Sized)


@pytest.fixture(scope="module")
def counters(procs4):
    return procs4.spawn("counters", Counter, 10)


def test_spawn_procs_on_this_host_has_exactly_the_per_host_dimensions(procs4):
    assert dict(procs4.extent) == {"gpus": 4}
    assert len(procs4) == 4 and len(set(procs4.pids)) == 4 and os.getpid() not in procs4.pids


def test_call_returns_value_mesh_over_extent(counters):
    vm = counters.whoami.call().get()
    assert isinstance(vm, ValueMesh) and vm.extent == Extent({"gpus": 4}) and len(vm) == 4
    assert [v["rank"] for v in vm.values()] == [0, 1, 2, 3]
    assert [dict(p) for p, _ in vm.items()] == [v["point"] for v in vm.values()]
    assert vm.item(gpus=2)["point"] == {"gpus": 2}
    assert all(v["size"] == {"gpus": 4} and v["mesh"] == "counters" for v in vm.values())
    with pytest.raises(KeyError, match="exactly the dimensions"):
        vm.item(hosts=0, gpus=2)


def test_state_persists_per_actor_across_calls(procs4):
    c = procs4.spawn("state", Counter, 0)
    c.incr.call(5).get()
    assert c.get.call().get().values() == [5, 5, 5, 5]
    assert c.slice(gpus=1).incr.call_one(2).get() == 7
    assert c.get.call().get().values() == [5, 7, 5, 5]


def test_call_one_on_single_actor_slice(counters):
    assert counters.slice(gpus=3).whoami.call_one().get()["rank"] == 3


def test_current_rank_is_the_actors_point_in_the_slice_a_call_was_sent_to_as_in_monarch(counters, procs4):
    # It was the actor's place in its whole mesh: a call to ranks 2-3 ran at ranks 2 and
    # 3 of size 4, where Monarch's current_rank() (context().message_rank) says 0 and 1 of
    # size 2 (work sharded by it went to the wrong shards). The actor's own place is
    # context().actor_instance.rank.
    halves = counters.slice(gpus=slice(2, 4)).whoami.call().get().values()
    assert [(v["message_rank"], v["message_size"], v["rank"]) for v in halves] == [(0, {"gpus": 2}, 2),
                                                                                   (1, {"gpus": 2}, 3)]
    one = counters.slice(gpus=3).whoami.call_one().get()
    assert (one["message_rank"], one["message_point"], one["message_size"], one["rank"]) == (0, {}, {}, 3)
    every = counters.whoami.call().get().values()
    assert [v["message_rank"] for v in every] == [0, 1, 2, 3] and every[0]["message_size"] == {"gpus": 4}
    strided = counters.slice(gpus=slice(1, 4, 2)).flatten("r").whoami.call().get().values()
    assert [(v["message_point"], v["rank"]) for v in strided] == [({"r": 0}, 1), ({"r": 1}, 3)]
    picked = counters.whoami.choose().get()  # one actor of the mesh called: its point in the mesh
    assert picked["message_rank"] == picked["rank"]
    waiting = procs4.spawn("where", AsyncWhere).slice(gpus=slice(1, 3)).where.call().get().values()
    assert waiting == [(0, {"gpus": 2}, 1), (1, {"gpus": 2}, 2)]


def test_call_one_on_many_actors_raises_value_error_naming_size(counters):
    with pytest.raises(ValueError, match="exactly 1 actor, but counters has 4"):
        counters.whoami.call_one()


def test_slice_of_slice_reaches_the_right_actors(counters):
    sub = counters.slice(gpus=slice(1, 4)).slice(gpus=slice(1, 3))
    assert dict(sub.extent) == {"gpus": 2}
    assert [v["rank"] for v in sub.whoami.call().get().values()] == [2, 3]
    assert [v["rank"] for v in counters.slice(gpus=slice(0, 4, 2)).whoami.call().get().values()] == [0, 2]


def test_slice_with_bad_dimension_raises_and_mesh_stays_usable(counters):
    with pytest.raises(ValueError, match="no dimension 'gpu'"):
        counters.slice(gpu=0)
    with pytest.raises(IndexError, match="out of range for dimension 'gpus' of size 4"):
        counters.slice(gpus=4)
    assert len(counters.whoami.call().get()) == 4


def test_choose_spreads_calls_over_actors(counters):
    ranks = {counters.whoami.choose().get()["rank"] for _ in range(8)}
    assert ranks == {0, 1, 2, 3}


def test_choose_prefers_idle_actors(counters):
    busy = counters.slice(gpus=0).slow_echo.call_one("x", 1.0)
    picks = [counters.whoami.choose() for _ in range(3)]
    assert 0 not in {f.get(timeout=30)["rank"] for f in picks}
    busy.get(timeout=30)


def test_choose_counts_a_call_over_the_whole_mesh_on_every_actor_and_one_rank_s_call_on_it(counters):
    # (2 s: the picks go out long before either call is done, however loaded the machine)
    everyone = counters.slow_echo.call("x", 2.0)  # (counted once for the whole mesh)
    busy = counters.slice(gpus=0).slow_echo.call_one("x", 2.0)
    picks = [counters.whoami.choose() for _ in range(3)]
    assert 0 not in {f.get(timeout=30)["rank"] for f in picks}
    assert len(everyone.get(timeout=30)) == 4 and busy.get(timeout=30) == "x"


def test_stream_yields_one_future_per_actor_in_arrival_order(counters):
    futures = list(counters.echo_after.stream({0: 0.5}))
    ranks = [f.get() for f in futures]
    assert sorted(ranks) == [0, 1, 2, 3] and ranks[-1] == 0  # the slow rank comes last
    assert all(f.done() for f in futures)


def test_broadcast_is_fire_and_forget_but_delivered_in_order(procs4):
    m = procs4.spawn("bcast", Counter)
    for i in range(20):
        assert m.record.broadcast(i) is None
    assert all(h == list(range(20)) for h in m.history.call().get().values())


def test_messages_from_one_client_are_handled_in_order(counters):
    m = counters.slice(gpus=2)
    futures = [m.record.call_one(i) for i in range(200)]
    for f in futures:
        f.get(timeout=30)
    hist = m.history.call_one().get()
    assert [x for x in hist if isinstance(x, int)][-200:] == list(range(200))


def test_one_actor_handles_one_message_at_a_time(procs4):
    m = procs4.spawn("serial", AsyncActor)
    one = m.slice(gpus=0)
    futures = [one.step.call_one(i, 0.05) for i in range(3)]
    assert [f.get(timeout=30) for f in futures] == [0, 1, 2]
    assert one.events_seen.call_one().get() == [("start", 0), ("end", 0), ("start", 1), ("end", 1),
                                                 ("start", 2), ("end", 2)]


def test_actors_in_different_procs_run_concurrently(procs4, tmp_path):
    m = procs4.spawn("rendezvous", Rendezvous)
    assert m.meet.call(str(tmp_path), 4).get(timeout=60).values() == [True] * 4


def test_endpoint_exception_becomes_actor_error_with_original_type(procs4):
    m = procs4.spawn("failing", Failing)
    with pytest.raises(ActorError) as info:
        m.slice(gpus=1).fail_on.call_one([1]).get()
    err = info.value
    assert isinstance(err.exception, ValueError) and "bad value on rank 1" in str(err.exception)
    assert "fail_on" in err.traceback and "ValueError: bad value on rank 1" in err.traceback
    assert [dict(p) for p in err.points] == [{}]  # slice(gpus=1) dropped the only dimension
    assert m.ok.call().get().values() == ["ok"] * 4  # the actor stays usable


def test_call_over_many_ranks_lists_every_failed_rank(procs4):
    m = procs4.spawn("failing", Failing)
    with pytest.raises(ActorError) as info:
        m.fail_on.call([1, 3]).get()
    assert [p.rank for p in info.value.points] == [1, 3]
    # Monarch's wording leads (its programs match it), then which ranks failed.
    assert str(info.value).startswith("Actor call failing.fail_on failed in 2 of 4 actor(s): {'gpus': 1/4}, "
                                      "{'gpus': 3/4}\n"), str(info.value)
    assert all(isinstance(f.exception, ValueError) for f in info.value.failures)


def test_custom_exception_type_is_preserved(procs4):
    m = procs4.spawn("failing", Failing)
    with pytest.raises(ActorError) as info:
        m.slice(gpus=0).fail_on.call_one([0], "custom").get()
    assert type(info.value.exception) is CustomError


def test_unpicklable_exception_arrives_as_remote_exception(procs4):
    m = procs4.spawn("failing", Failing)
    with pytest.raises(ActorError) as info:
        m.slice(gpus=0).fail_on.call_one([0], "unpicklable").get()
    exc = info.value.exception
    assert isinstance(exc, RemoteException) and exc.type_name.endswith("UnpicklableError")
    assert "cannot travel" in str(exc)


def test_unpicklable_return_value_is_reported_not_hung(procs4):
    m = procs4.spawn("failing", Failing)
    with pytest.raises(ActorError) as info:
        m.slice(gpus=0).return_unpicklable.call_one().get(timeout=30)
    assert isinstance(info.value.exception, SerializationError)
    assert "return value of failing.return_unpicklable" in str(info.value.exception)


def test_init_failure_raises_at_spawn_listing_ranks_when_asked(procs4):
    with pytest.raises(ActorError) as info:
        procs4.spawn("badinit", BadInit, 2, raise_init_errors=True)
    assert [p.rank for p in info.value.points] == [2] and isinstance(info.value.exception, RuntimeError)
    ok = procs4.spawn("badinit", BadInit, 99)  # the name is free again
    assert len(ok) == 4


def test_unknown_endpoint_names_the_available_ones(counters):
    with pytest.raises(AttributeError, match=r"Counter has no endpoint 'incrr' \(endpoints: .*incr"):
        counters.incrr


def test_non_endpoint_method_says_to_decorate_it(counters):
    with pytest.raises(AttributeError, match=r"Counter.helper is not an endpoint; decorate it with @endpoint"):
        counters.helper


def test_calling_endpoint_directly_says_which_adverb_to_use(counters):
    with pytest.raises(TypeError, match=r"use \.call\(\.\.\.\)"):
        counters.incr(1)


def test_spawning_a_non_actor_class_raises_type_error(procs4):
    with pytest.raises(TypeError, match="NotAnActor is not an Actor subclass"):
        procs4.spawn("nope", NotAnActor)


def test_endpoints_named_like_mesh_attributes_are_refused_before_anything_is_sent(procs4):
    # Monarch refuses them too: mesh.size / mesh.stop would be the mesh's, not the endpoints
    with pytest.raises(ValueError, match=r"(?s)Sized has endpoint\(s\) named like ActorMesh attributes: "
                                         r"mesh.size would be ActorMesh.size, not the endpoint Sized.size; "
                                         r"mesh.stop would be .*; rename the endpoint"):
        procs4.spawn("sized", Sized)
    assert procs4._control().actor_mesh_record("procs4", "sized") is None


def test_endpoints_named_like_attributes_monarch_lacks_win(procs4):
    named = procs4.spawn("named", Named)
    try:
        assert named.name.call().get(timeout=30).values() == [f"named {r}" for r in range(4)]
        assert named.slice(gpus=2).restart.call_one("asked").get(timeout=30) == "restarted: asked"
        assert repr(named) == "<ActorMesh 'named' sample_actors.Named {'gpus': 4}>"
    finally:
        named.stop()


@pytest.mark.parametrize("init_timeout", [-5, 0])
def test_an_init_timeout_not_above_zero_is_refused_before_anything_is_sent(procs4, init_timeout):
    with pytest.raises(ValueError, match=rf"spawn\(init_timeout={init_timeout}\): give the seconds each __init__ "
                                         r"may take, a number > 0, or None for no limit"):
        procs4.spawn("untimed", Counter, init_timeout=init_timeout)
    assert procs4._control().actor_mesh_record("procs4", "untimed") is None


def test_unpicklable_argument_raises_in_client_and_cluster_stays_healthy(counters):
    with pytest.raises(SerializationError, match="an argument of counters.record could not be pickled"):
        counters.record.call(threading.Lock())
    assert len(counters.get.call().get()) == 4


class RefusesToPickle:
    def __getstate__(self):
        raise RuntimeError("__getstate__ says no")


def test_what_an_arguments_getstate_raises_reaches_the_caller_as_it_is(counters):
    # Monarch lets it propagate: its tests expect the RuntimeError itself.
    with pytest.raises(RuntimeError, match="__getstate__ says no") as info:
        counters.record.call(RefusesToPickle())
    assert not isinstance(info.value, SerializationError)
    assert "(raised while pickling an argument of counters.record)" in info.value.__notes__
    assert len(counters.get.call().get()) == 4


def test_message_over_size_limit_raises_in_client(counters, monkeypatch):
    monkeypatch.setenv("MONARCH_NB_MAX_MESSAGE_BYTES", "4096")
    with pytest.raises(MessageTooLarge, match="over the 4096-byte limit"):
        counters.record.call(b"x" * 10_000)
    monkeypatch.delenv("MONARCH_NB_MAX_MESSAGE_BYTES")
    assert len(counters.get.call().get()) == 4


def test_future_get_times_out_and_can_be_retried(counters):
    fut = counters.slice(gpus=1).slow_echo.call_one("late", 0.5)
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.05)
    assert fut.get(timeout=30) == "late"


def test_a_timed_out_call_says_it_still_runs_and_how_to_stop_it(counters):
    fut = counters.slice(gpus=3).slow_echo.call_one("late", 0.5)
    with pytest.raises(TimeoutError, match=r"counters.slow_echo is still running on its actors, and their next calls "
                                           r"wait behind it .*: to stop it, call procs.interrupt\(\) on its proc mesh "
                                           r"\('procs4'; in a notebook %monarch interrupt counters\)"):
        fut.get(timeout=0.05)
    assert fut.get(timeout=30) == "late"


def test_a_rank_that_raised_while_others_run_on_is_told_on_stderr_and_named_by_a_timeout(
        counters, tmp_path, capsys, monkeypatch):
    # The call waited for the other ranks in silence: if they waited on the failed one
    # (a collective), until its timeout, which named neither the rank nor its error.
    monkeypatch.setattr(endpoint_module, "RAISED_NOTICE_S", 0.1)
    gate = tmp_path / "gate"
    gate.touch()
    future = counters.raise_or_hold.call(1, str(gate))
    told: list[str] = []

    def heard() -> bool:
        with pytest.raises(TimeoutError):
            future.get(timeout=0.2)  # (a wait is what takes in this client's replies)
        told.append(capsys.readouterr().err)
        return "gave up" in "".join(told)

    assert wait_until(heard, 30)
    assert "counters.raise_or_hold: rank {'gpus': 1/4} raised CustomError: rank 1 gave up over 0.1 s ago, and the " \
           "call still waits for 3 other rank(s)" in "".join(told)
    with pytest.raises(TimeoutError, match=r"did not finish within 0.05 s; rank \{'gpus': 1/4\} raised CustomError: "
                                           r"rank 1 gave up \(the ranks still out may be waiting on them"):
        future.get(timeout=0.05)
    gate.unlink()
    with pytest.raises(ActorError, match="rank 1 gave up"):
        future.get(timeout=30)
    assert "gave up" not in capsys.readouterr().err  # told once


def test_a_call_stopped_after_a_rank_raised_names_what_it_raised(host, tmp_path):
    # Its error said only that the procs were stopped: the rank's own error was lost.
    procs = host.spawn_procs(per_host={"gpus": 2}, name="stopped_after")
    try:
        (tmp_path / "gate").touch()
        future = procs.spawn("c", Counter).raise_or_hold.call(1, str(tmp_path / "gate"))

        def rank_1_answered() -> bool:
            with pytest.raises(TimeoutError):
                future.get(timeout=0.2)
            return future._answered() == 1

        assert wait_until(rank_1_answered, 30)
    finally:
        procs.stop()
    with pytest.raises(SupervisionError, match=r"before that, rank \{'gpus': 1/2\} raised CustomError: rank 1 gave up"):
        future.get(timeout=30)


def test_futures_are_awaitable(counters):
    async def main():
        vm = await counters.get.call()
        one = await counters.slice(gpus=0).get.call_one()
        both = await asyncio.gather(counters.slice(gpus=1).get.call_one(), counters.slice(gpus=2).get.call_one())
        return vm, one, both

    vm, one, both = asyncio.run(main())
    assert len(vm) == 4 and one == vm.item(gpus=0) and both == [vm.values()[1], vm.values()[2]]


def test_a_done_callback_that_raises_is_reported_and_the_others_still_run(counters, capfd):
    # It stopped the callbacks after it, the one an ``await`` waits on among them.
    def broken(_) -> None:
        raise RuntimeError("a broken callback")

    ran: list = []
    future = counters.get.call()
    future.add_done_callback(broken)
    future.add_done_callback(lambda f: ran.append(len(f.get(0))))
    assert len(future.get(timeout=30)) == 4 and ran == [4]
    awaited = counters.slice(gpus=0).get.call_one()
    awaited.add_done_callback(broken)

    async def main():
        return await asyncio.wait_for(asyncio.ensure_future(_awaiting(awaited)), 30)

    async def _awaiting(f):
        return await f

    assert asyncio.run(main()) == awaited.get(0)
    assert capfd.readouterr().err.count("RuntimeError: a broken callback") == 2


def test_actor_holding_another_mesh_calls_it_sync_and_async(procs4, counters):
    expected = sum(counters.get.call().get().values())
    callers = procs4.slice(gpus=slice(0, 2)).spawn("callers", Caller, counters)
    assert callers.sum_of_other.call().get().values() == [expected, expected]
    async_callers = procs4.slice(gpus=slice(0, 2)).spawn("async_callers", AsyncCaller, counters)
    assert async_callers.async_sum_of_other.call().get().values() == [expected, expected]


def test_spawn_with_existing_name_returns_live_mesh_or_raises(procs4):
    a = procs4.spawn("named", Counter, 0)
    a.incr.call(3).get()
    again = procs4.spawn("named", Counter, 0)
    assert again.get.call().get().values() == [3] * 4  # same live actors
    with pytest.raises(ValueError, match="actor mesh named 'named' exists"):
        procs4.spawn("named", Failing)
    fresh = procs4.spawn("named", Counter, 0, replace=True)
    assert fresh.get.call().get().values() == [0] * 4


def test_actor_mesh_stop_frees_the_name(procs4):
    m = procs4.spawn("stoppable", Counter, 1)
    m.stop()
    assert procs4.spawn("stoppable", Failing).ok.call().get().values() == ["ok"] * 4


def test_this_proc_runs_actors_in_the_client_process():
    local = this_proc().spawn("local_counter", Counter, 1)
    assert local.whoami.call_one().get()["pid"] == os.getpid()
    assert local.incr.call_one(2).get() == 3
    local.stop()


def test_current_rank_in_client_is_empty():
    assert current_rank().rank == 0 and dict(current_rank()) == {}


def test_proc_mesh_stop_ends_its_processes(host):
    procs = host.spawn_procs(per_host={"gpus": 2}, name="short_lived")
    pids = procs.pids
    assert len(pids_alive(pids)) == 2
    procs.stop()
    assert wait_until(lambda: not pids_alive(pids), 10)


def test_reply_that_arrives_while_the_call_is_still_sending_is_not_lost(counters, monkeypatch):
    async def wait_for(fut):
        return await fut

    # An await in another thread keeps the pump thread dispatching replies meanwhile.
    background = threading.Thread(
        target=lambda: asyncio.run(wait_for(counters.slice(gpus=0).slow_echo.call_one("x", 1.0))))
    background.start()
    assert wait_until(lambda: runtime().mailbox._async_waiters > 0, 10)
    original = Mailbox.send_to_each  # the way a call's frames leave for its actors

    def send_then_stall(self, addresses, frames):
        original(self, addresses, frames)
        time.sleep(0.2)  # fault injection: the reply lands before the call returns

    monkeypatch.setattr(Mailbox, "send_to_each", send_then_stall)
    assert counters.slice(gpus=1).whoami.call_one().get(timeout=10)["rank"] == 1
    background.join(timeout=30)


def test_a_long_wait_on_many_ranks_reports_progress(counters, monkeypatch):
    seen = []

    class Recorder:
        def __init__(self, description, total, started=None):
            seen.append(("open", description, total))

        def update(self, done):
            seen.append(("update", done))

        def close(self):
            seen.append(("close",))

    monkeypatch.setattr(runtime(), "bar_factory", Recorder)
    assert counters.slow_echo.call("x", 1.3).get().values() == ["x"] * 4
    assert seen[0] == ("open", "counters.slow_echo", 4)
    assert seen[-2:] == [("update", 4), ("close",)]
    seen.clear()
    counters.slow_echo.call("y", 0).get()
    assert seen == []  # done within the first second: no bar


def test_a_slow_spawns_bar_ends_complete_and_counts_time_from_the_spawns_start(procs4, monkeypatch):
    # It froze grey at "0/2 ranks done in 1.0 s" after a successful spawn (closed with no
    # count), its time leaving out the second before it showed (issue 23).
    import time

    from bad_actors import SlowInit

    seen = []

    class Recorder:
        def __init__(self, description, total, started=None):
            seen.append(("open", description, total, started))

        def update(self, done):
            seen.append(("update", done))

        def close(self):
            seen.append(("close",))

    monkeypatch.setattr(runtime(), "bar_factory", Recorder)
    began = time.monotonic()
    mesh = procs4.spawn("slow_bar", SlowInit, 1.5)
    try:
        (_, description, total, started), *rest = seen
        assert (description, total) == ("slow_bar: SlowInit.__init__", 4)
        assert began <= started <= began + 0.5  # the spawn's start, not the bar's (a second later)
        assert rest[-2:] == [("update", 4), ("close",)]
    finally:
        mesh.stop()


def test_spawning_many_procs_reports_how_many_are_up(host, monkeypatch):
    from monarch_nb.client import progress
    from monarch_nb.wire import mailbox

    seen = []

    class Recorder:
        def __init__(self, description, total, started=None):
            seen.append((description, total))

        def update(self, done):
            seen.append(done)

        def close(self):
            seen.append("close")

    monkeypatch.setattr(runtime(), "bar_factory", Recorder)
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(mailbox, "CHECK_S", 0.02)
    procs = host.spawn_procs(per_host={"gpus": 12}, name="counted")
    try:
        assert seen[0] == ("spawning 12 procs", 12)
        counts = [s for s in seen[1:-1] if isinstance(s, int)]
        assert counts == sorted(counts) and counts[-1] == 12 and seen[-1] == "close"
    finally:
        procs.stop()
