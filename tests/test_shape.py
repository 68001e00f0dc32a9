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
