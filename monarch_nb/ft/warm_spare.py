"""A warm spare for replica groups (``ReplicaGroups(spare=True)``): one group's procs
started in advance, with the modules the group's actors import (``torch``) already
imported, so that replacing a failed group costs its constructors and not a fresh
interpreter's imports (on a loaded host, importing torch is most of a recovery).

The spare has no actors and no torch.distributed group: those are made for the group it
replaces, after it is taken. A new spare is started once the replaced group steps again,
so that it does not compete for the CPUs with the recovery.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from importlib import import_module

from ..client.host_mesh import HostMesh
from ..client.proc_mesh import ProcMesh


def import_modules(names: tuple[str, ...]) -> None:
    """Import ``names`` in this process (a spare proc's bootstrap); one that does not
    import is left out (the group's actors import what they need themselves)."""
    for name in names:
        try:
            import_module(name)
        except ImportError:
            pass


class WarmSpare:
    """Spare procs of ``per_group`` on ``hosts`` (or on the hosts ``hosts()`` chooses
    when each spare starts), named ``{name}_spare_N``, each having imported ``modules``;
    started in the background. Nothing raises here: a spare that fails to start is
    reported by :meth:`take` returning ``None`` (the group is then spawned afresh) and
    kept in ``last_error``. ``named(mesh)`` hears each spare's proc mesh name first."""

    def __init__(self, hosts: HostMesh | Callable[[], HostMesh], name: str, per_group: dict[str, int],
                 modules: Iterable[str], named: Callable[[str], None] = lambda mesh: None):
        self._hosts, self._name, self._per_group = hosts, name, dict(per_group)
        self._named = named  # told each spare's proc mesh name before it is spawned
        self._bootstrap = functools.partial(import_modules, tuple(modules))
        self._lock = threading.Lock()
        self._ready: ProcMesh | None = None
        self._starting: threading.Thread | None = None
        self._made = 0
        self._host_ids: list[str] = []  # the hosts of the spare starting or ready
        self._stopped = False
        self.last_error = ""

    def refill(self) -> None:
        """Start a spare in the background unless one is ready or starting. Non-blocking."""
        with self._lock:
            if self._stopped or self._ready is not None or (self._starting is not None and self._starting.is_alive()):
                return
            self._made += 1
            self._starting = threading.Thread(target=self._start, args=(f"{self._name}_spare_{self._made}",),
                                              daemon=True, name=f"monarch-nb-spare-{self._name}")
            self._starting.start()

    def ready_pids(self) -> list[int] | None:
        """The pids of the spare ready now, or ``None`` while none is."""
        with self._lock:
            return None if self._ready is None else self._ready.pids

    def host_ids(self) -> list[str]:
        """The ids of the hosts the spare that is starting or ready runs on."""
        with self._lock:
            return list(self._host_ids)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the spare being started is up (``timeout`` seconds, ``None``: no
        limit); returns whether one is ready."""
        with self._lock:
            starting = self._starting
        if starting is not None:
            starting.join(timeout)
        return self.ready_pids() is not None

    def take(self) -> ProcMesh | None:
        """The spare procs if one is ready (no longer this spare's), else ``None`` at
        once (one still starting is left to finish for the next failure)."""
        with self._lock:
            spare, self._ready = self._ready, None
            if spare is not None:
                self._host_ids = []
        return spare

    def stop(self) -> None:
        """Stop the spare, waiting for one that is starting. Blocking."""
        with self._lock:
            self._stopped = True
            starting = self._starting
        if starting is not None:
            starting.join()
        spare = self.take()
        if spare is not None:
            spare.stop()

    def _start(self, mesh_name: str) -> None:
        self._named(mesh_name)
        try:
            hosts = self._hosts() if callable(self._hosts) else self._hosts
            with self._lock:
                self._host_ids = list(hosts._hosts)
            procs = hosts.spawn_procs(per_host=self._per_group, name=mesh_name, bootstrap=self._bootstrap)
        except Exception as e:  # noqa: BLE001 - without a spare a failed group is spawned afresh
            with self._lock:
                self._host_ids = []
            self.last_error = f"{type(e).__name__}: {e}"
            return
        with self._lock:
            stopped = self._stopped
            if not stopped:
                self._ready = procs
        if stopped:
            procs.stop()
