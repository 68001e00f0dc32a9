"""health()'s wait for status replies, without processes: a proc whose exit is reported
while its status is awaited is let go at once and left out, and the others' answers stand."""
import asyncio
from types import SimpleNamespace

from monarch_nb.hub.health import STATUS_TIMEOUT_S, Health


class _Net:
    """Answers ``status`` at once for the addresses in ``answering``; never for the rest."""

    def __init__(self, answering: set[str]):
        self.answering = answering

    async def request(self, address, header, timeout=None):
        if address in self.answering:
            return SimpleNamespace(header={"actors": [], "from": address})
        await asyncio.sleep(timeout)  # the network never answers: only the timeout ends it
        raise TimeoutError(address)


def _proc(name):
    return SimpleNamespace(proc_id=name, address=f"tcp://{name}", exit_code=None, host_id="h0")


def test_a_proc_reported_exited_while_awaited_is_let_go_and_the_rest_answer():
    up, exiting, silent = _proc("up"), _proc("exiting"), _proc("silent")
    health = Health("c", registry=SimpleNamespace(hosts={}), net=_Net({up.address}), meshes=None, hub_stats=dict)

    async def run():
        loop = asyncio.get_running_loop()
        loop.call_soon(lambda: setattr(exiting, "exit_code", -9))  # its exit reported meanwhile
        started = loop.time()
        statuses = await health._statuses([up, exiting, silent])
        return statuses, loop.time() - started

    statuses, took = asyncio.run(run())
    assert statuses == {"up": {"actors": [], "from": "tcp://up"}, "silent": None}
    assert took < STATUS_TIMEOUT_S * 3  # the silent one is waited for once, not forever


def test_every_proc_exiting_while_awaited_ends_the_wait_without_error():
    procs = [_proc(f"p{i}") for i in range(5)]
    health = Health("c", registry=SimpleNamespace(hosts={}), net=_Net(set()), meshes=None, hub_stats=dict)

    async def run():
        for p in procs:
            asyncio.get_running_loop().call_soon(lambda p=p: setattr(p, "exit_code", 1))
        return await health._statuses(procs)

    assert asyncio.run(run()) == {}
