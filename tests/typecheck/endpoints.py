"""Checked by mypy in tests/test_typing.py (not run): each line marked ``# E: CODE``
must give exactly that mypy error code, and every other line none."""

from monarch_nb.actor import Actor, Future, ValueMesh, endpoint, this_host


class Trainer(Actor):
    @endpoint
    def train(self, step: int, lr: float = 0.1) -> str:
        return f"{step} {lr}"

    @endpoint
    async def loss(self) -> float:
        return 0.5

    @endpoint
    def twice(self, step: int) -> str:
        return self.train(step) * 2  # in the actor, an endpoint is the plain method


procs = this_host().spawn_procs(per_host={"gpus": 2})
trainers = procs.spawn("trainers", Trainer)

everyone: Future[ValueMesh[str]] = trainers.train.call(1)
one: Future[str] = trainers.slice(gpus=0).train.call_one(step=1, lr=0.2)
chosen: float = trainers.loss.choose().get()
streamed: list[str] = [f.get() for f in trainers.train.stream(3)]
trainers.train.broadcast(4)
width: int = len(trainers.flatten("all")) + trainers.size("gpus")

trainers.train.call("one")  # E: arg-type
trainers.train.call(1, 2, 3)  # E: call-arg
trainers.train.call(step=1, rate=0.1)  # E: call-arg
wrong: Future[int] = trainers.train.call_one(1)  # E: assignment
trainers.loss.call(1)  # E: call-arg
trainers.nothing.call()  # E: attr-defined
