"""Defaults of a service's options that more than one of its modules read."""

# Health checks (``service.health_checks``; Ray Serve's defaults), in seconds: how often
# each proc of a healthy replica is asked for its status, and how long it may take.
HEALTH_CHECK_PERIOD_S = 10.0
HEALTH_CHECK_TIMEOUT_S = 30.0

# The restart budget (``service.restarts``): a replica is replaced at most MAX_RESTARTS
# times within any RESTART_WINDOW_S seconds (failed starts count). 10 minutes is the run
# after which Kubernetes forgives a container's crashes: a replica lost once an hour is
# always replaced; one that needs a 4th replacement within 10 minutes is crash-looping
# (each replacement takes seconds), and replacing it again spends procs (GPUs) on the loop.
MAX_RESTARTS = 3
RESTART_WINDOW_S = 600.0
