"""The actor the reconnect benchmark spawns (importable, so fresh clients can too)."""

from monarch_nb.actor import Actor, endpoint


class Echo(Actor):
    @endpoint
    def ping(self, x=None):
        return x
