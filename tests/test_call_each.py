"""call_one_each: one call to the single actor of several actor meshes, sent as one (a
service's fanout). Each mesh's future behaves as its call_one's would."""

from __future__ import annotations

import os
import signal

import pytest

from monarch_nb.actor import Actor, endpoint
from monarch_nb.client.call_each import call_one_each
from monarch_nb.errors import ActorError, SupervisionError
from conftest import wait_until

BOUND_S = 60


class Box(Actor):
    def __init__(self, tag: str):
        self.tag, self.calls = tag, 0

    @endpoint
    def put(self, x):
        self.calls += 1
        if isinstance(x, str) and x == "boom" and self.tag == "b":
            raise ValueError(f"{self.tag} refuses boom")
        return (self.tag, os.getpid(), x)

    @endpoint
    def count(self) -> int:
        return self.calls


@pytest.fixture
def boxes(host):
    made = []

    def make(*tags):
        meshes = []
        for tag in tags:
            procs = host.spawn_procs(per_host={"procs": 1}, name=f"each-{tag}")
            made.append(procs)
            meshes.append(procs.spawn("box", Box, tag))
        return meshes

    yield make
    for procs in made:
        procs.stop()


def test_each_mesh_gets_the_call_and_its_own_future_in_order(boxes):
    meshes = boxes("a", "b", "c")
    futures = call_one_each([m.put for m in meshes], ("x",), {})
    assert [f.get(timeout=BOUND_S)[0::2] for f in futures] == [("a", "x"), ("b", "x"), ("c", "x")]
    assert [m.put.call_one("y").get(timeout=BOUND_S)[0] for m in meshes] == ["a", "b", "c"]  # call_one unchanged
    assert call_one_each([], (), {}) == []


def test_an_endpoint_error_fails_only_its_meshs_future(boxes):
    meshes = boxes("a", "b")
    ok, bad = call_one_each([m.put for m in meshes], ("boom",), {})
    assert ok.get(timeout=BOUND_S)[0] == "a"
    with pytest.raises(ActorError, match="b refuses boom"):
        bad.get(timeout=BOUND_S)


def test_a_dead_actor_fails_its_future_with_supervision_error_and_the_others_answer(boxes):
    meshes = boxes("a", "b")
    pid = meshes[1].put.call_one(0).get(timeout=BOUND_S)[1]
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: meshes[1].initialized.exception() is not None, BOUND_S)
    alive, dead = call_one_each([m.put for m in meshes], (1,), {})
    assert alive.get(timeout=BOUND_S)[0] == "a"
    with pytest.raises(SupervisionError, match="each-b"):
        dead.get(timeout=BOUND_S)


def test_a_mesh_of_several_actors_is_refused_before_anything_is_sent(boxes, host):
    [one] = boxes("a")
    procs = host.spawn_procs(per_host={"procs": 2}, name="each-two")
    try:
        two = procs.spawn("box", Box, "two")
        with pytest.raises(ValueError, match="call_one needs a mesh of exactly 1 actor"):
            call_one_each([one.put, two.put], (1,), {})
        assert one.count.call_one().get(timeout=BOUND_S) == 0
    finally:
        procs.stop()


def test_arguments_with_buffers_arrive_whole(boxes):
    np = pytest.importorskip("numpy", reason="numpy gives the out-of-band buffers")
    meshes = boxes("a", "b")
    array = np.arange(100_000, dtype=np.float32)
    got = [f.get(timeout=BOUND_S)[2] for f in call_one_each([m.put for m in meshes], (array,), {})]
    assert all(np.array_equal(g, array) for g in got)
