"""Actors for tests/test_torchft_quorum.py: one rank of a replica group under a
``torchft.Manager`` (imported by the procs by name, so torchft is imported there only)."""

from __future__ import annotations

import os
from datetime import timedelta

from monarch_nb.actor import Actor, endpoint


class FTTrainer(Actor):
    """Each step all-reduces (averages) ``group + 1`` over the groups in TorchFT's quorum,
    and counts the steps TorchFT let it commit; a group that joins late heals that count
    from a healthy group (TorchFT's ``state_dict`` / ``load_state_dict``)."""

    def __init__(self):
        import torch.distributed as dist
        from torchft import Manager, ProcessGroupGloo

        # the group's own process group: its TCPStore (at MASTER_ADDR:MASTER_PORT) is the
        # one the Manager uses
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        self.group = int(os.environ["REPLICA_GROUP_ID"])
        self.committed = 0
        self.manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), min_replica_size=1,
                               load_state_dict=self._load, state_dict=self._state, replica_id=f"group{self.group}",
                               timeout=timedelta(seconds=10), quorum_timeout=timedelta(seconds=30),
                               connect_timeout=timedelta(seconds=10))

    def _state(self):
        return {"committed": self.committed}

    def _load(self, state):
        self.committed = state["committed"]

    @endpoint
    def step(self) -> dict:
        import torch

        self.manager.start_quorum()
        value = torch.tensor([float(self.group + 1)])
        self.manager.allreduce(value).wait()
        committed = self.manager.should_commit()
        if committed:
            self.committed += 1
        return {"group": self.group, "value": float(value), "participants": self.manager.num_participants(),
                "committed": committed, "total": self.committed, "pid": os.getpid()}

    @endpoint
    def env(self) -> dict:
        return {k: os.environ[k] for k in ("TORCHFT_LIGHTHOUSE", "REPLICA_GROUP_ID", "NUM_REPLICA_GROUPS")}
