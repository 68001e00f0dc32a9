"""Defaults of a service's options that more than one of its modules read."""

# Health checks (``service.health_checks``; Ray Serve's defaults), in seconds: how often
# each proc of a healthy replica is asked for its status, and how long it may take.
HEALTH_CHECK_PERIOD_S = 10.0
HEALTH_CHECK_TIMEOUT_S = 30.0
