"""A service's record in the hub's registry: which proc meshes are the replicas of which
service (``monarch_nb.service``), so that the health tree groups them and a client that
connects later (a restarted kernel) gets a working handle on the service again.

A client sends the record with ``hub_ops.SPAWN_PROCS`` as the field ``SERVICE``; the hub
keeps it on the proc mesh's record (and in its state file) and never reads it except to
group replicas in the health tree. A record is small: names and numbers, no payload
(the actor's class and arguments are the actor mesh's, kept by the hub already).
"""

from __future__ import annotations

SERVICE = "service"  # hub_ops.SPAWN_PROCS field and proc mesh record key: the record below, or absent

# Keys of the record.
NAME = "name"  # the service's name (``options(name=...)``, default the class name in lower case)
# unique in the cluster: NAME-<6 hex>; its replicas' meshes are named KEY-r<idx>g<generation modulo 10>
# (one digit: a name used again after 9 other starts of the replica; service.restarts)
KEY = "key"
CLASS = "class"  # the actor class's qualified name, for display
REPLICA = "replica"  # this proc mesh's replica index, 0..REPLICAS-1
REPLICAS = "replicas"  # how many replicas the service has
GENERATION = "generation"  # 1 for a replica's first procs, +1 for each replacement by new procs
PROCS = "procs"  # procs per host of each replica
MAX_RESTARTS = "max_restarts"  # replacements allowed per replica within RESTART_WINDOW_S
# seconds (None: within the service's life); absent from records written before it existed
RESTART_WINDOW_S = "restart_window_s"
ENDPOINTS = "endpoints"  # endpoint -> {BATCH_SIZE, BATCH_TIMEOUT, IDEMPOTENT, ROUTER}

# Keys of an endpoint's entry.
BATCH_SIZE = "batch_size"
BATCH_TIMEOUT = "batch_timeout"
IDEMPOTENT = "idempotent"
ROUTER = "router"  # the router class's name (a client that adopts the service makes a built-in one of it)


def group(proc_meshes: dict[str, dict]) -> dict[str, dict]:
    """The services among ``proc_meshes`` (name -> a proc mesh record carrying
    ``SERVICE``, e.g. ``Cluster.info()["proc_meshes"]``), by service name: the newest
    record of each with ``"replica_meshes"`` (replica idx -> the proc mesh of its newest
    generation) and ``"replica_generations"`` (idx -> that generation). Two services of one name (two clients made one each)
    are keyed ``NAME`` and ``KEY``."""
    by_key: dict[str, dict] = {}
    for mesh_name, mesh in proc_meshes.items():
        record = mesh.get(SERVICE)
        if not record:
            continue
        entry = by_key.setdefault(record[KEY], {**record, "replica_meshes": {}, "replica_generations": {}})
        idx, gen = record[REPLICA], record[GENERATION]
        if gen >= entry["replica_generations"].get(idx, 0):
            entry["replica_generations"][idx] = gen
            entry["replica_meshes"][idx] = mesh_name
    names: dict[str, int] = {}
    for entry in by_key.values():
        names[entry[NAME]] = names.get(entry[NAME], 0) + 1
    found = {}
    for key, entry in sorted(by_key.items()):
        entry.pop(REPLICA, None)
        entry.pop(GENERATION, None)
        found[entry[NAME] if names[entry[NAME]] == 1 else key] = entry
    return found
