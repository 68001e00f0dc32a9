"""What a cluster asks a worker started with ``run_worker_loop_forever`` (see
``monarch_nb.host.worker``): the one request, sent as JSON because the worker holds no
cluster key yet (nothing from it is ever unpickled), and the reply's keys."""

from __future__ import annotations

# Request keys: become the host agent HOST_ID of the cluster in CLUSTER_DIR whose hub is
# at HUB, keeping procs GRACE seconds after the hub falls silent.
CLUSTER_DIR = "cluster_dir"
HUB = "hub"
HOST_ID = "host_id"
GRACE = "grace"

# Reply keys: the worker's pid (the agent keeps it) and host name, or ERROR.
PID = "pid"
HOSTNAME = "hostname"
ERROR = "error"
