"""The harness's stand-in for Monarch's ``python/tests/proc_mesh_test_utils.py``.

Monarch's module holds one autouse fixture, ``stop_all_proc_meshes``, which test modules
import to stop the proc meshes a test left behind; it finds them through the root
client's private ``_children`` under a ``monarch.config`` teardown cap. This one does the
same through monarch_nb: the proc meshes the current cluster gained during the test are
stopped after it. (run.py puts this file in place of Monarch's after extracting the
tests, as plugin.py takes the place of Monarch's conftest.py.)
"""

import pytest


def _cluster():
    from monarch_nb.client.runtime import runtime

    return runtime().cluster


@pytest.fixture(autouse=True)
def stop_all_proc_meshes():
    cluster = _cluster()
    before = set(cluster.proc_meshes) if cluster is not None else set()
    yield
    cluster = _cluster()
    if cluster is None:
        return
    try:
        meshes = cluster.proc_meshes
    except Exception:  # noqa: BLE001 - the test stopped its cluster: nothing is left to stop
        return
    for name, mesh in meshes.items():
        if name not in before:
            mesh.stop()
