"""Which dimensions meshes have, as in Monarch: ``this_host()`` of a one-host cluster
has none, so its proc meshes are over exactly ``per_host``; a cluster's host mesh
keeps ``{"hosts": N}``, also for one host, and its proc meshes are over
``{"hosts": N, **per_host}``."""

import pytest

from monarch_nb.actor import Cluster, Extent
from monarch_nb.health_view import to_plain
from sample_actors import Counter


def test_this_host_of_a_one_host_cluster_has_no_dimensions(host):
    assert dict(host.extent) == {} and len(host) == 1 and not host.is_fake_in_process


def test_the_cluster_host_mesh_keeps_the_hosts_dimension_for_one_host(cluster):
    hosts = cluster.host_mesh()
    assert dict(hosts.extent) == {"hosts": 1}
    assert dict(hosts.slice(hosts=0).extent) == {} and dict(hosts.slice(hosts=slice(0, 1)).extent) == {"hosts": 1}


def test_procs_of_the_cluster_host_mesh_are_over_hosts_and_per_host(cluster):
    procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 2}, name="with_hosts")
    try:
        counters = procs.spawn("c", Counter)
        vm = counters.whoami.call().get()
        assert procs.extent == Extent({"hosts": 1, "gpus": 2}) == vm.extent
        assert vm.item(hosts=0, gpus=1)["point"] == {"hosts": 0, "gpus": 1}
        assert counters.slice(hosts=0, gpus=1).whoami.call_one().get()["rank"] == 1
    finally:
        procs.stop()


def test_per_host_may_name_hosts_when_the_host_mesh_has_no_such_dimension(host):
    procs = host.spawn_procs(per_host={"hosts": 2, "gpus": 2}, name="fake_hosts")
    try:
        vm = procs.spawn("c", Counter).whoami.call().get()
        assert procs.extent == Extent({"hosts": 2, "gpus": 2}) and len(set(procs.pids)) == 4
        assert vm.item(hosts=1, gpus=0)["point"] == {"hosts": 1, "gpus": 0}
        assert vm.item(hosts=1, gpus=0)["rank"] == 2 and vm.item(hosts=1, gpus=0)["size"] == {"hosts": 2, "gpus": 2}
    finally:
        procs.stop()


def test_per_host_naming_a_dimension_of_the_host_mesh_is_refused(cluster):
    with pytest.raises(ValueError, match=r"per_host names \['hosts'\], which the host mesh \{'hosts': 1\} already has"):
        cluster.host_mesh().spawn_procs(per_host={"hosts": 2}, name="overlap")
    assert "overlap" not in cluster.proc_meshes


def test_spawn_procs_without_per_host_is_one_proc_with_no_dimensions(cluster, host):
    procs = host.spawn_procs(name="single")
    try:
        single = procs.spawn("c", Counter)
        assert dict(procs.extent) == {} and len(procs) == 1 and dict(single.extent) == {}
        me = single.whoami.call_one().get()
        assert me["point"] == {} and me["rank"] == 0 and me["size"] == {}
        assert single.whoami.call().get().item()["rank"] == 0
        assert "c  sample_actors.Counter · on single · no dimensions · 1/1 healthy" in to_plain(cluster.health())
    finally:
        procs.stop()


def test_this_host_of_a_multi_host_cluster_is_every_host_over_the_hosts_dimension():
    cluster = Cluster.start_ephemeral(hosts=2)
    try:
        hosts = cluster.this_host()
        assert dict(hosts.extent) == {"hosts": 2}
        assert dict(hosts.spawn_procs(per_host={"gpus": 1}, name="two").extent) == {"hosts": 2, "gpus": 1}
    finally:
        cluster.stop()
