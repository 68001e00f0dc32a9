import random

import pytest

from monarch_nb.mesh import Extent, Point, Shape


def test_extent_is_ordered_mapping_with_row_major_points():
    e = Extent({"hosts": 2, "gpus": 4})
    assert list(e) == ["hosts", "gpus"] and e.nelements == 8
    p = e.point(5)
    assert dict(p) == {"hosts": 1, "gpus": 1} and p.rank == 5
    assert e.rank_of({"gpus": 1, "hosts": 1}) == 5
    assert [q.rank for q in e.points()] == list(range(8))


@pytest.mark.parametrize("bad", [{"gpus": 0}, {"gpus": -1}, {"gpus": 1.5}, {"no good": 2}, {"x": True}])
def test_extent_rejects_bad_sizes_and_labels(bad):
    with pytest.raises(ValueError):
        Extent(bad)


def test_int_slice_drops_dimension_and_slice_keeps_it():
    s = Shape.of({"hosts": 2, "gpus": 4})
    assert s.slice(gpus=slice(0, 2)).base_ranks() == [0, 1, 4, 5]
    one = s.slice(hosts=1)
    assert dict(one.extent) == {"gpus": 4} and one.base_ranks() == [4, 5, 6, 7]
    assert s.slice(hosts=1, gpus=2).base_ranks() == [6] and dict(s.slice(hosts=1, gpus=2).extent) == {}
    assert s.slice(gpus=-1).base_ranks() == [3, 7]


def test_slice_of_slice_composes_offsets_and_steps():
    s = Shape.of({"gpus": 8})
    evens = s.slice(gpus=slice(0, 8, 2))
    assert evens.base_ranks() == [0, 2, 4, 6]
    assert evens.slice(gpus=slice(1, 3)).base_ranks() == [2, 4]
    assert evens.slice(gpus=3).base_ranks() == [6]


def test_base_ranks_of_some_ranks_are_those_of_each_and_an_outside_rank_is_refused():
    view = Shape.of({"hosts": 2, "gpus": 4}).slice(gpus=slice(1, 4, 2))  # base ranks 1, 3, 5, 7
    assert view.base_ranks_of([3, 0, 2]) == [view.base_rank(3), view.base_rank(0), view.base_rank(2)] == [7, 1, 5]
    assert view.base_ranks_of(range(4)) == view.base_ranks()
    for bad in (4, -1):
        with pytest.raises(IndexError, match=f"rank {bad} is out of range.*4 elements"):
            view.base_ranks_of([0, bad])


def _views(seed: int, count: int):
    """Random slices of random meshes (up to 4 dimensions, slices of slices)."""
    rng = random.Random(seed)
    for _ in range(count):
        view = Shape.of({f"d{i}": rng.randint(1, 5) for i in range(rng.randint(1, 4))})
        for _ in range(rng.randint(0, 2)):
            picks = {}
            for label, size in view.extent.items():
                if rng.random() < 0.2 and len(picks) < len(view.extent) - 1:
                    picks[label] = rng.randrange(size)
                elif rng.random() < 0.5:
                    start = rng.randrange(size)
                    picks[label] = slice(start, rng.randint(start + 1, size), rng.randint(1, 3))
            view = view.slice(**picks)
        yield view


def test_the_point_at_a_base_rank_is_the_views_point_there_and_none_outside_it():
    # What an actor learns its message_rank from: its own base rank in the view a call was sent to.
    for view in _views(seed=24, count=500):
        ranks = view.base_ranks()
        for base in range(-1, ranks[-1] + 3):
            point = view.point_of_base(base)
            if base in ranks:
                assert point is not None and point.rank == ranks.index(base), (view, base)
                assert view.base_rank(point.rank) == base
            else:
                assert point is None, (view, base, point)
    # a hand-made view whose strides are not row-major nesting is answered all the same
    odd = Shape(Extent({"a": 3, "b": 2}), 1, (1, 3))  # base ranks 1, 4, 2, 5, 3, 6
    assert [odd.point_of_base(b) and odd.point_of_base(b).rank for b in range(8)] == [None, 0, 2, 4, 1, 3, 5, None]


def test_slice_errors_name_the_dimension_and_size():
    s = Shape.of({"hosts": 1, "gpus": 4})
    with pytest.raises(ValueError, match=r"no dimension 'gpu'.*\['hosts', 'gpus'\]"):
        s.slice(gpu=0)
    with pytest.raises(IndexError, match="index 4 is out of range for dimension 'gpus' of size 4"):
        s.slice(gpus=4)
    with pytest.raises(IndexError, match="selects nothing"):
        s.slice(gpus=slice(3, 3))
    with pytest.raises(TypeError, match="int or a slice"):
        s.slice(gpus="0")


def test_point_equality_and_str():
    e = Extent({"gpus": 4})
    assert e.point(2) == Point((2,), e) == {"gpus": 2}
    assert str(e.point(2)) == "{'gpus': 2/4}"


def test_a_rank_spec_naming_a_dimension_is_refused_naming_the_meshs_dimensions():
    from monarch_nb.mesh.ranks import parse_ranks_of

    extent = Extent({"hosts": 2, "gpus": 4})
    assert parse_ranks_of("1,5-6", "workers", extent) == [1, 5, 6]
    with pytest.raises(ValueError, match=r"'gpu' is not a dimension of workers \(dimensions: hosts=2, gpus=4\)"):
        parse_ranks_of("gpu=0", "workers", extent)
    with pytest.raises(ValueError, match=r"\(dimensions: hosts=2, gpus=4\), not coordinates: gpus=1 is ranks '1,5'"):
        parse_ranks_of("gpus=1", "workers", extent)
    with pytest.raises(ValueError, match="rank 8 is out of range for 8 ranks"):
        parse_ranks_of("8", "workers", extent)
