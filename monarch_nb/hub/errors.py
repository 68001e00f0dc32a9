"""The error a hub operation raises to fail a request with a message for the client."""


class HubError(Exception):
    """Fails the request: the client raises ``error_type`` (``ClusterError`` or
    ``ValueError``) with this message."""

    def __init__(self, message: str, error_type: str = "ClusterError"):
        super().__init__(message)
        self.error_type = error_type
