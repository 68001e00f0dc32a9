"""The public actor API (Monarch-compatible names).

    from monarch_nb.actor import Actor, endpoint, this_host

    class Trainer(Actor):
        @endpoint
        def train(self, step: int) -> float: ...

    procs = this_host().spawn_procs(per_host={"gpus": 8})   # extent {"gpus": 8}
    trainers = procs.spawn("trainers", Trainer)
    losses = trainers.train.call(step=0).get()              # ValueMesh
"""

from .client.actor_mesh import ActorMesh
from .client.cluster import Cluster, this_host
from .client.endpoint import Endpoint
from .client.future import Future
from .client.host_mesh import HostMesh
from .client.local_proc import this_proc
from .client.proc_mesh import ProcMesh
from .client.runtime import set_failure_hook
from .client.value_mesh import ValueMesh
from .errors import (ActorError, ClusterError, InvalidRequest, MeshFailure, MessageTooLarge, MonarchNbError,
                     RemoteException, SerializationError, SupervisionError)
from .mesh import Extent, Point, Shape
from .proc.actor import Actor, Context, context, current_rank, current_size, endpoint

__all__ = [
    "Actor", "ActorError", "ActorMesh", "Cluster", "ClusterError", "Context", "Endpoint", "Extent",
    "Future", "HostMesh", "InvalidRequest", "MeshFailure", "MessageTooLarge", "MonarchNbError", "Point", "ProcMesh", "RemoteException",
    "SerializationError", "Shape", "SupervisionError", "ValueMesh", "context", "current_rank",
    "current_size", "endpoint", "set_failure_hook", "this_host", "this_proc",
]
