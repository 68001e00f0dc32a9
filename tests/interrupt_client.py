"""The client side of tests/test_interrupts.py, run in its own process so that the
test can send it SIGINT at random instants.

``python interrupt_client.py storm`` starts an ephemeral cluster, prints ``READY
<cluster dir>``, then loops over ``call``, ``call_one``, ``choose``, ``broadcast`` and
``stream`` (each ``KeyboardInterrupt`` caught and counted) until SIGUSR1; then makes
``CHECKED`` calls whose values it checks, and prints one JSON object of what it saw.
``python interrupt_client.py own_handler`` does the same under a SIGINT handler of the
user's own. ``python interrupt_client.py hammer`` instead calls ``interrupt()`` on busy actors
from the main thread while a second thread keeps calling them.
"""

from __future__ import annotations

import faulthandler
import itertools
import json
import signal
import sys
import threading
import traceback

from monarch_nb.client.cluster import Cluster
from monarch_nb.errors import ActorError
from monarch_nb.wire import frames, interrupts
from interrupt_actors import Recorder

CHECKED = 200
HANG_S = 120  # tests/test_interrupts.py gives up on a client after this long (seconds)


def main(mode: str) -> None:
    # If this client hangs, the test kills it at HANG_S: every thread's stack reaches
    # the test's captured stderr first, so the failure says where it waited.
    faulthandler.dump_traceback_later(HANG_S - 10)
    cluster = Cluster.start_ephemeral()
    report: dict = {"path": str(cluster.path), "interrupts": 0, "other_errors": []}
    try:
        procs = cluster.host_mesh().spawn_procs(per_host={"gpus": 2}, name="p")
        mesh = procs.spawn("rec", Recorder)
        {"storm": storm, "own_handler": own_handler_storm, "hammer": hammer}[mode](mesh, procs, report)
        ids = itertools.count(10**6, 2)
        wrong = 0
        for _ in range(CHECKED):  # after the storm: every call answers, right
            i = next(ids)
            if mesh.note.call(i).get(timeout=30).values() != [i, i]:
                wrong += 1
            if mesh.slice(gpus=1).note.call_one(i + 1).get(timeout=30) != i + 1:
                wrong += 1
        report["wrong"] = wrong
        seen = mesh.seen.call().get(timeout=30).values()
        report["duplicates"] = sum(len(s) - len(set(s)) for s in seen)
        executed = set().union(*seen)
        report["lost"] = sorted(set(report.pop("returned", [])) - executed)[:20]
        report["dropped_client"] = frames.dropped()
        report["dropped_procs"] = mesh.dropped.call().get(timeout=30).values()
        report["threads_alive"] = mesh.alive.call().get(timeout=30).values()
    finally:
        cluster.stop()
    print(json.dumps(report), flush=True)


@interrupts.protected  # the harness's own loop and bookkeeping: a Ctrl-C waits for _one_call
def storm(mesh, procs, report, one_call=None) -> None:
    one_call = one_call or _one_call
    stop = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: stop.set())
    returned: list[int] = []  # ids of calls whose future this client got: each must run
    report["returned"] = returned
    one = mesh.slice(gpus=0)
    print("READY", report["path"], flush=True)
    i = 0
    while not stop.is_set() and len(report["other_errors"]) < 5:
        i += 1
        try:
            one_call(mesh, one, i, returned)
        except KeyboardInterrupt:
            report["interrupts"] += 1
        except BaseException as e:  # noqa: BLE001 - the test fails on any of these
            report["other_errors"].append("".join(traceback.format_exception(type(e), e, e.__traceback__))[-2000:])
    report["loop_calls"] = i
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C still deferred is over: the checks follow


@interrupts.checkpoint
def _one_call(mesh, one, i: int, returned: list[int], **rich) -> None:
    """One call of each kind in turn, as a user's cell would make it: a Ctrl-C may land
    at any instant in here."""
    kind = i % 5
    if kind == 0:
        fut = mesh.note.call(i, **rich)
        returned.append(i)
        assert fut.get(timeout=30).values() == [i, i]
    elif kind == 1:
        fut = one.note.call_one(i, **rich)
        returned.append(i)
        assert fut.get(timeout=30) == i
    elif kind == 2:
        fut = mesh.note.choose(i, **rich)
        returned.append(i)
        assert fut.get(timeout=30) == i
    elif kind == 3:
        mesh.note.broadcast(i)
        returned.append(i)
    else:
        for fut in mesh.note.stream(i, **rich):
            assert fut.get(timeout=30) == i


def own_handler_storm(mesh, procs, report) -> None:
    """``storm`` under a SIGINT handler of the user's own (some training libraries
    install one), which raises ``KeyboardInterrupt`` as Python's does: the runtime leaves
    it alone, so an interrupt lands at any bytecode of a call, the runtime's included.
    Replies unpickle Python code (as tensors do), so some land inside an unpickle. The
    handler raises once per call (armed as the call starts), so that the harness's own
    bookkeeping around the calls stays whole."""
    armed = [False]

    def users_handler(signum, frame) -> None:
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    def armed_call(mesh, one, i: int, returned: list[int]) -> None:
        armed[0] = True
        try:
            _one_call(mesh, one, i, returned, rich=True)
        finally:
            armed[0] = False

    signal.signal(signal.SIGINT, users_handler)
    storm(mesh, procs, report, armed_call)


def hammer(mesh, procs, report) -> None:
    done = threading.Event()
    outcomes = {"completed": 0, "interrupted": 0}

    def caller() -> None:
        ids = itertools.count(10**7)
        while not done.is_set():
            try:
                mesh.busy.call(next(ids), 0.05).get(timeout=30)
                outcomes["completed"] += 1
            except ActorError as e:
                if all(isinstance(f.exception, KeyboardInterrupt) for f in e.failures):
                    outcomes["interrupted"] += 1
                else:
                    report["other_errors"].append(str(e)[-2000:])
            except BaseException as e:  # noqa: BLE001
                report["other_errors"].append(repr(e))

    thread = threading.Thread(target=caller)
    thread.start()
    try:
        for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 300):
            procs.interrupt()
    finally:
        done.set()
        thread.join(60)
    report.update(outcomes, caller_hung=thread.is_alive())


if __name__ == "__main__":
    main(sys.argv[1])
