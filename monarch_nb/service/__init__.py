"""Services (issue 26): replicated actor meshes behind ``route()`` and ``fanout()``, in
TorchForge's shape.

    from monarch_nb.actor import Actor, endpoint
    from monarch_nb.service import service_endpoint

    class Policy(Actor):
        @endpoint
        def generate(self, prompt: str) -> str: ...

    svc = Policy.options(procs=1, num_replicas=4).as_service()
    svc.generate.route("2+2=").get()       # one healthy replica
    svc.generate.fanout("2+2=").get()      # a list: one per healthy replica
    with svc.session():                    # these calls go to one replica
        ...
    svc.get_metrics(); svc.shutdown()

    cluster.services["policy"]             # after a kernel restart: the same replicas
"""

from .endpoint_config import EndpointConfig, service_endpoint
from .errors import NoHealthyReplica, ServiceError, ServiceStopped, SessionMoved, UnknownSession
from .options import ServiceOptions, options
from .replica import Replica, ReplicaState
from .routers import LeastLoadedRouter, RoundRobinRouter, Router, SessionRouter
from .endpoint import ServiceEndpoint
from .metrics import ServiceMetrics
from .service import Service
from .sessions import SessionContext
from .adopt import connect_service, services

__all__ = [
    "EndpointConfig", "LeastLoadedRouter", "NoHealthyReplica", "Replica", "ReplicaState", "RoundRobinRouter",
    "Router", "Service", "ServiceEndpoint", "ServiceError", "ServiceMetrics", "ServiceOptions", "ServiceStopped",
    "SessionContext", "SessionMoved", "SessionRouter", "UnknownSession", "connect_service", "options",
    "service_endpoint", "services",
]
