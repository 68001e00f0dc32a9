"""A class the client defines in its ``__main__`` (a notebook's ``class Cfg``) is never
changed by values coming back from actors: cloudpickle ships it by value and, without
care, a returned instance overwrites the client's class attributes with the worker's
copy. The workers still follow the client's edits."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r'''
import json
from monarch_nb.actor import Actor, endpoint, this_host

class Cfg:
    level = 1

class Keeper(Actor):
    @endpoint
    def keep(self, cfg):
        self.cfg = cfg
        return cfg

    @endpoint
    def make(self):
        return Cfg()

    @endpoint
    def level_here(self):
        return Cfg.level

keeper = this_host().spawn_procs(per_host={"gpus": 1}).spawn("keeper", Keeper)
keeper.keep.call_one(Cfg()).get(timeout=60)
Cfg.level = 3
made = keeper.make.call_one().get(timeout=60)
seen = {"after_return": Cfg.level, "same_class": type(made) is Cfg}
keeper.keep.call_one(Cfg()).get(timeout=60)  # sends the class as it is now
seen["worker_follows"] = keeper.level_here.call_one().get(timeout=60)
print(json.dumps(seen))
'''


def test_a_returned_instance_leaves_the_clients_own_class_alone():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"after_return": 3, "same_class": True, "worker_follows": 3}
