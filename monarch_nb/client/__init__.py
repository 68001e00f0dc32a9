"""Client side of the actor API: mesh handles, endpoints, futures, clusters."""
