"""Monarch's smaller names that need no procs: ``ValueMesh.slice``/``flatten``,
``Extent.labels``/``sizes`` as lists, ``str(point)``, ``Future._from_coro``, an
``Accumulator`` over any endpoint's ``stream()``, and ``_explicit_response_port`` on
concurrent endpoints."""

from __future__ import annotations

import asyncio

import pytest

from monarch_nb.actor import Accumulator, Actor, Extent, Future, ValueMesh, concurrent_endpoint, endpoint


def test_value_mesh_slices_and_flattens_like_an_actor_mesh():
    vm = ValueMesh(Extent({"hosts": 1, "gpus": 3}), ["a", "b", "c"])
    assert vm.slice(hosts=0, gpus=1).item() == "b"
    assert vm.slice(gpus=slice(1, 3)).values() == ["b", "c"]
    flat = vm.flatten("r")
    assert dict(flat.extent) == {"r": 3} and flat.slice(r=2).item() == "c"
    with pytest.raises(ValueError, match="no dimension"):
        vm.slice(nodes=0)


def test_extent_labels_and_sizes_are_lists_and_points_print_as_in_monarch():
    extent = Extent({"hosts": 2, "gpus": 4})
    assert extent.labels == ["hosts", "gpus"] and extent.sizes == [2, 4]
    assert str(extent.point(5)) == "{'hosts': 1/2, 'gpus': 1/4}"


def test_future_from_coroutine_gives_its_value_or_its_error():
    async def value():
        await asyncio.sleep(0)
        return 7

    async def failing():
        raise KeyError("nope")

    assert Future._from_coro(value()).get(timeout=10) == 7
    with pytest.raises(KeyError, match="nope"):
        Future._from_coro(failing()).get(timeout=10)


def test_accumulator_folds_any_endpoint_like_stream_from_identity():
    class Streamed:
        def stream(self, *args, **kwargs):
            self.asked = (args, kwargs)
            return iter([Future._from_coro(asyncio.sleep(0, result=v)) for v in (1, 2, 3)])

    ep = Streamed()
    assert Accumulator(ep, [], lambda acc, v: acc + [v]).accumulate("a", k=1).get(timeout=10) == [1, 2, 3]
    assert ep.asked == (("a",), {"k": 1})


class Gate(Actor):
    @concurrent_endpoint
    async def wait(self) -> None:
        pass

    @endpoint
    async def release(self) -> None:
        pass


def test_concurrent_endpoints_carry_monarchs_explicit_response_port_flag():
    assert Gate.wait._explicit_response_port and not Gate.release._explicit_response_port
