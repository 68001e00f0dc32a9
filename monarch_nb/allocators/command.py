"""Command allocator: host agents started through a command prefix, one per host.

``CommandAllocator([["ip", "netns", "exec", "a"], ["ip", "netns", "exec", "b"]],
bind="10.0.0.1")`` starts agent ``i`` as ``PREFIX_i python -m monarch_nb.host ...``:
each in its own network namespace here, or on another machine with a prefix such as
``["ssh", "node7"]`` (that machine then needs the same Python environment and the
cluster directory at the same path). Agents bind on the interface that routes to the
hub; the hub binds on ``bind``. Otherwise it behaves as the local allocator: agents
are the hub's children and are stopped with it.
"""

from __future__ import annotations

from ..wire import interfaces
from .local import LocalAllocator


class CommandAllocator(LocalAllocator):
    kind = "command"

    def __init__(self, prefixes: list[list[str]], bind: str, cluster_dir: str = "", grace_s: float = 10.0,
                 allocation: str = ""):
        if not prefixes or any(not isinstance(p, (list, tuple)) for p in prefixes):
            raise ValueError("prefixes: give one command prefix (a list of words) per host, e.g. "
                             "[['ip', 'netns', 'exec', 'a'], ['ssh', 'node7']]; [] runs an agent here")
        super().__init__(cluster_dir, grace_s, allocation)
        self.prefixes = [[str(w) for w in p] for p in prefixes]
        self.bind = interfaces.check_bind_address(bind)

    @property
    def hosts(self) -> int:
        return len(self.prefixes)

    @classmethod
    def from_spec(cls, spec: dict, cluster_dir: str, grace_s: float, allocation: str = "") -> "CommandAllocator":
        return cls(spec["prefixes"], spec["bind"], cluster_dir, grace_s, allocation)

    def spec(self) -> dict:
        return {"kind": self.kind, "prefixes": self.prefixes, "bind": self.bind}

    def bind_address(self) -> str:
        return self.bind

    def _prefix(self, index: int) -> list[str]:
        return self.prefixes[index]

    def _agent_args(self) -> list[str]:
        return ["--bind", "auto"]
