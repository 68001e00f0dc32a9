"""A spawn under a live mesh's name gets that mesh only when it would make the same one:
the same class code and constructor arguments. A notebook cell re-run after an edit of
the class, or with other arguments, got the live mesh running the old code with the old
arguments, with nothing said (a new user's notebook: "[10, 10] <- expected [2, 2]")."""

from __future__ import annotations

import textwrap

import pytest

from monarch_nb.actor import Actor, endpoint
from monarch_nb.client.spawn_digest import spawn_digests

_WORKER = textwrap.dedent("""
    from monarch_nb.actor import Actor, endpoint

    class Worker(Actor):
        def __init__(self, start):
            self.value = start

        @endpoint
        def get(self):
            return self.value * {factor}
""")


def _worker(factor: int = 1, filename: str = "<cell-1>", blank_lines: int = 0) -> type:
    """A Worker class as a notebook cell defines it (``filename``: the kernel's cell file)."""
    namespace: dict = {"__name__": "__main__"}
    exec(compile("\n" * blank_lines + _WORKER.format(factor=factor), filename, "exec"), namespace)
    return namespace["Worker"]


def test_the_same_class_and_arguments_digest_alike_in_another_kernel_and_an_edit_does_not():
    first = spawn_digests(_worker(), (1,), {}, 100)
    assert spawn_digests(_worker(filename="<another kernel's cell>", blank_lines=3), (1,), {}, 100) == first
    edited = spawn_digests(_worker(factor=10), (1,), {}, 100)
    assert edited["code"] != first["code"] and edited["args"] == first["args"]
    other_args = spawn_digests(_worker(), (2,), {}, 100)
    assert other_args["code"] == first["code"] and other_args["args"] != first["args"]


def test_arguments_it_cannot_pickle_or_too_large_are_not_compared():
    assert spawn_digests(_worker(), (lambda: 1,), {}, 100)["args"] is None
    assert spawn_digests(_worker(), (1,), {}, 2 << 20)["args"] is None


class Base(Actor):
    def helper(self):
        return 1


class Child(Base):
    @endpoint
    def get(self):
        return self.helper()


def test_a_base_classes_code_counts_too():
    before = spawn_digests(Child, (), {}, 10)["code"]
    original = Base.helper
    try:
        Base.helper = lambda self: 2
        assert spawn_digests(Child, (), {}, 10)["code"] != before
    finally:
        Base.helper = original


def test_a_spawn_that_would_make_another_mesh_under_a_live_ones_name_is_refused(host):
    procs = host.spawn_procs(per_host={"gpus": 2}, name="digests")
    try:
        workers = procs.spawn("w", _worker(), 1)
        assert workers.get.call().get(timeout=60).values() == [1, 1]
        assert procs.spawn("w", _worker(filename="<re-run>"), 1)._addresses == workers._addresses  # a re-run: kept
        with pytest.raises(ValueError, match=r"an actor mesh named 'w' exists on proc mesh 'digests', made from "
                                             r"other constructor arguments \(__main__.Worker\); it still runs that: "
                                             r"pass replace=True"):
            procs.spawn("w", _worker(), 2)
        with pytest.raises(ValueError, match="made from other code of its class"):
            procs.spawn("w", _worker(factor=10), 1)
        assert workers.get.call().get(timeout=60).values() == [1, 1]  # the live one is untouched
        replaced = procs.spawn("w", _worker(factor=10), 2, replace=True)
        assert replaced.get.call().get(timeout=60).values() == [20, 20]
    finally:
        procs.stop()
