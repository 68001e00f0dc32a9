"""Actor classes used by the tests (importable by procs through sys.path)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

from monarch_nb.actor import Actor, current_rank, current_size, context, endpoint


def own_rank() -> int:
    """This actor's rank in its own mesh, whatever slice a call was sent to (current_rank()
    is the rank in that slice, as in Monarch)."""
    return context().actor_instance.rank.rank


class Counter(Actor):
    def __init__(self, start: int = 0):
        self.value = start
        self.log: list = []

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.value += by
        return self.value

    @endpoint
    def get(self) -> int:
        return self.value

    @endpoint
    def record(self, item) -> None:
        self.log.append(item)

    @endpoint
    def history(self) -> list:
        return self.log

    @endpoint
    def whoami(self) -> dict:
        """This actor's place in its mesh (``rank``, ``point``, ``size``), and where it
        appears in what the call was sent to (``message_*``: Monarch's current_rank())."""
        ctx = context()
        me = ctx.actor_instance.rank
        return {"rank": me.rank, "point": dict(me), "size": dict(me.extent),
                "message_rank": current_rank().rank, "message_point": dict(current_rank()),
                "message_size": current_size(), "mesh": ctx.actor_instance.mesh_name, "pid": os.getpid()}

    @endpoint
    def slow_echo(self, x, seconds: float):
        time.sleep(seconds)
        return x

    @endpoint
    def echo_after(self, delays: dict) -> int:
        """Return this rank after sleeping ``delays[rank]`` seconds (default 0)."""
        rank = own_rank()
        time.sleep(delays.get(rank, 0.0))
        return rank

    @endpoint
    def raise_or_hold(self, failing_rank: int, gate_path: str) -> int:
        """Rank ``failing_rank`` raises ``CustomError`` at once; the others return once
        the file ``gate_path`` is gone (as ranks waiting in a collective the failed one
        never joins)."""
        rank = own_rank()
        if rank == failing_rank:
            raise CustomError(f"rank {rank} gave up")
        while os.path.exists(gate_path):
            time.sleep(0.05)
        return rank

    def helper(self) -> str:  # deliberately not an endpoint
        return "local"


class CustomError(Exception):
    pass


class UnpicklableError(Exception):
    def __init__(self, msg):
        super().__init__(msg)
        self.lock = threading.Lock()


class Failing(Actor):
    @endpoint
    def fail_on(self, ranks: list, exc_kind: str = "value"):
        if own_rank() in ranks:
            if exc_kind == "custom":
                raise CustomError(f"custom failure on {own_rank()}")
            if exc_kind == "unpicklable":
                raise UnpicklableError("cannot travel")
            raise ValueError(f"bad value on rank {own_rank()}")
        return own_rank()

    @endpoint
    def return_unpicklable(self):
        return threading.Lock()

    @endpoint
    def ok(self) -> str:
        return "ok"


class BadInit(Actor):
    def __init__(self, fail_rank: int):
        if current_rank().rank == fail_rank:
            raise RuntimeError(f"init failed on {fail_rank}")


class Rendezvous(Actor):
    """Each rank waits until every rank has arrived: only works if actors run concurrently."""

    @endpoint
    def meet(self, directory: str, n: int, timeout: float = 20.0) -> bool:
        Path(directory, str(own_rank())).touch()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(os.listdir(directory)) >= n:
                return True
            time.sleep(0.01)
        return False


class Arrays(Actor):
    @endpoint
    def checksum(self, data) -> tuple:
        import numpy as np

        arr = data.numpy() if hasattr(data, "numpy") and not isinstance(data, np.ndarray) else data
        return (type(data).__name__, str(data.dtype), tuple(data.shape), int(np.asarray(arr).view(np.uint8).sum()))

    @endpoint
    def echo(self, data):
        return data

    @endpoint
    def type_of(self, *values) -> list:
        return [type(v).__name__ for v in values]

    @endpoint
    def scaled(self, data, factor):
        return data * factor

    @endpoint
    def sum_then_zero(self, data) -> int:
        """The sum of array ``data``, which this actor then overwrites with zeros."""
        total = int(data.sum())
        data[:] = 0
        return total

    @endpoint
    def wire_stats(self) -> int:
        from monarch_nb.wire import frames

        return frames.dropped()

    @endpoint
    def set_shm_min_bytes(self, value: int) -> int:
        """Set this proc's ``wire.shm.MIN_BYTES`` (large replies then go through the
        socket when it is huge); returns the previous value."""
        from monarch_nb.wire import shm

        old, shm.MIN_BYTES = shm.MIN_BYTES, value
        return old


class Caller(Actor):
    """Holds another mesh's handle and calls it from its own endpoints."""

    def __init__(self, other):
        self.other = other

    @endpoint
    def sum_of_other(self) -> int:
        return sum(self.other.get.call().get().values())

    @endpoint
    def echo_through_other(self, data) -> int:
        """``data`` to the other mesh's one actor's ``echo`` and back: its size in bytes
        if it came back equal, else -1."""
        back = self.other.echo.call_one(data).get(timeout=120)
        return memoryview(data).nbytes if memoryview(back).tobytes() == memoryview(data).tobytes() else -1


class AsyncCaller(Actor):
    """``Caller`` with an async endpoint (an actor's endpoints are all sync or all async)."""

    def __init__(self, other):
        self.other = other

    @endpoint
    async def async_sum_of_other(self) -> int:
        values = await self.other.get.call()
        await asyncio.sleep(0)
        return sum(values.values())


class AsyncActor(Actor):
    def __init__(self):
        self.events: list = []

    @endpoint
    async def step(self, i: int, delay: float) -> int:
        self.events.append(("start", i))
        await asyncio.sleep(delay)
        self.events.append(("end", i))
        return i

    @endpoint
    async def events_seen(self) -> list:
        return self.events


class NotAnActor:
    @endpoint
    def hi(self):
        return "hi"


class Sized(Actor):
    """Endpoints named like ActorMesh attributes that Monarch also has: refused at spawn."""

    @endpoint
    def size(self) -> int:
        return 1

    @endpoint
    def stop(self) -> None:
        pass

    @endpoint
    def echo(self, x):
        return x


class Named(Actor):
    """Endpoints named like ActorMesh attributes Monarch's ActorMesh lacks: they win."""

    @endpoint
    def name(self) -> str:
        return f"named {current_rank().rank}"

    @endpoint
    def restart(self, why: str) -> str:
        return f"restarted: {why}"


class Printer(Actor):
    """Prints in the ways real code does: print, stderr, C-level writes, floods."""

    @endpoint
    def say(self, lines: list, stream: str = "stdout") -> int:
        out = sys.stderr if stream == "stderr" else sys.stdout
        for line in lines:
            print(line, file=out)
        return own_rank()

    @endpoint
    def numbered(self, n: int) -> int:
        rank = own_rank()
        for i in range(n):
            print(f"r{rank} line {i}")
        return n

    @endpoint
    def from_c(self, text: str) -> None:
        libc = ctypes.CDLL(None)
        libc.printf(b"%s\n", text.encode())
        libc.fflush(None)

    @endpoint
    def partial(self, text: str) -> None:
        print(f"50%\r{text}", end="", flush=True)  # no newline: ends with the call

    @endpoint
    def in_thread(self, text: str) -> None:
        worker = threading.Thread(target=print, args=(text,))
        worker.start()
        worker.join()

    @endpoint
    def print_then_die(self, n: int) -> None:
        for i in range(n):
            print(f"last words {i}")
        os.kill(os.getpid(), signal.SIGKILL)


class AsyncWhere(Actor):
    @endpoint
    async def where(self) -> tuple:
        """Monarch's current_rank() and current_size() after an await (the call's own
        message_rank across its steps)."""
        await asyncio.sleep(0.01)
        return current_rank().rank, current_size(), own_rank()
