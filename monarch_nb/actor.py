"""The public actor API (Monarch-compatible names).

    from monarch_nb.actor import Actor, endpoint, this_host

    class Trainer(Actor):
        @endpoint
        def train(self, step: int) -> float: ...

    procs = this_host().spawn_procs(per_host={"gpus": 8})   # extent {"gpus": 8}
    trainers = procs.spawn("trainers", Trainer)
    losses = trainers.train.call(step=0).get()              # ValueMesh
    procs.stop()                                            # a finished Future: await it, or not

Names are Monarch's (``monarch.actor``'s ``__all__``) for everything monarch_nb has.
"""

from .client import absent as _absent
from .client.accumulator import Accumulator
from .client.actor_mesh import ActorMesh
from .client.attach import attach_to_workers
from .client.channel import Channel, PortReceiver
from .client.cluster import Cluster, shutdown_context, this_host
from .client.controller import get_or_spawn_controller
from .client.endpoint import Endpoint, as_endpoint, concurrent_endpoint, endpoint, send
from .client.future import Future
from .client.bootstrap_command import BootstrapCommand, default_bootstrap_cmd
from .client.host_mesh import HostMesh
from .client.local_proc import this_proc
from .client.proc_mesh import ProcMesh
from .client.runtime import runtime, set_failure_hook
from .client.value_mesh import ValueMesh
from .errors import (ActorError, CallCycleError, ClusterError, InvalidRequest, MeshFailure, MessageTooLarge, MonarchNbError,
                     RemoteException, SerializationError, SupervisionError)
from .host.worker import run_worker_loop_forever
from .mesh import Extent, Point, Shape
from .proc.actor import Actor, Context, context, current_actor_name, current_rank, current_size
from .service.options import options as _service_options
from .wire.port import Port



def unhandled_fault_hook(failure: MeshFailure) -> None:
    """Called (on the client's event thread) with each supervision failure that no
    owning actor's ``__supervise__`` handled, as in Monarch: replace it by assigning
    ``monarch_nb.actor.unhandled_fault_hook = my_hook``. It must not block.

    This default does nothing more than what happens anyway: the dead actors' calls
    fail with :class:`SupervisionError`, and the failure is armed (the next call on
    the affected mesh raises it) or, in a notebook, shown under the running cell.
    Monarch's default ends the client with ``sys.exit(1)``; here what a hook raises is
    printed instead, so that a notebook kernel survives (see the README's differences).
    """


# Looked up at each failure: assigning the module attribute replaces the hook.
runtime().supervision.fault_hook = lambda: globals()["unhandled_fault_hook"]

# TorchForge's spelling of a service: Cls.options(procs=1, num_replicas=4).as_service(...)
# (monarch_nb.service; ServiceOptions(Cls, ...) is the same for code that type-checks it).
Actor.options = classmethod(_service_options)  # type: ignore[attr-defined]

__all__ = [
    "Accumulator", "Actor", "ActorError", "BootstrapCommand", "default_bootstrap_cmd", "ActorMesh", "CallCycleError", "Channel", "Cluster", "ClusterError", "Context", "Endpoint",
    "Extent", "Future", "HostMesh", "InvalidRequest", "MeshFailure", "MessageTooLarge", "MonarchNbError", "Point",
    "Port", "PortReceiver", "ProcMesh", "RemoteException", "SerializationError", "Shape", "SupervisionError",
    "ValueMesh", "as_endpoint", "concurrent_endpoint", "context", "current_actor_name", "current_rank", "current_size", "endpoint",
    "attach_to_workers", "get_or_spawn_controller", "run_worker_loop_forever", "send", "set_failure_hook",
    "shutdown_context",
    "this_host", "this_proc", "unhandled_fault_hook",
]

# Monarch's names monarch_nb leaves out: importable, and NotImplementedError naming them
# when used (monarch_nb.client.absent; listed in docs/compatibility.md).
__getattr__ = _absent.module_getattr("monarch.actor", {
    "ProcId": "ids are strings here (PROC_ID.MESH[RANK], see current_actor_name())",
    "Uid": "ids are strings here (PROC_ID.MESH[RANK], see current_actor_name())",
    "attach": "a client joins a cluster with monarch_nb.connect(name); workers join with attach_to_workers",
    "config": "monarch.config's runtime knobs are Rust-level; see docs/configuration.md for monarch_nb's",
    "debug_controller": "debug with %monarch break / %monarch debug or a DAP client (docs/debugging.md)",
    "hosts_from_config": "hosts come from a job (monarch_nb.job) or a cluster's allocator",
    "enable_transport": "messages go over ZeroMQ (TCP between hosts, IPC on one); there is no transport to pick",
    "ChannelTransport": "messages go over ZeroMQ (TCP between hosts, IPC on one); there is no transport to pick",
    "get_meter": "telemetry (OpenTelemetry metrics and traces) is not built",
    "span": "telemetry (OpenTelemetry metrics and traces) is not built",
    "traced": "telemetry (OpenTelemetry metrics and traces) is not built",
})
