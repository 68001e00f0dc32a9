"""A host's forkserver: a warm interpreter, the host agent's child, that has imported
what a proc imports (and ``MONARCH_NB_PROC_PRELOAD``'s modules, e.g. ``torch``) and forks
a proc for each start request, so a proc costs a fork rather than an interpreter
start and ~0.15 s of imports (issue 24: 256 procs on 2 cores took 24 s to start).

``python -m monarch_nb.host.forkserver --ppid AGENT --fd N``: serves the agent on the
``SOCK_SEQPACKET`` socket N (``protocol.forkserver_ops``). It has no thread and no zmq
context when it forks (a forked child inherits neither locks held by other threads nor
sockets), dies with the agent (``PR_SET_PDEATHSIG``), and reports each proc's exit
status to the agent, whose children the procs are not. A proc's children that outlive
it are re-parented to the agent, a child subreaper, as before.

What a forked proc shares with its siblings that a started one would not: Python's hash
seed (``PYTHONHASHSEED``) and whatever a preloaded module made at import. ``random`` is
reseeded by Python at fork; numpy's global generator, if numpy was preloaded, here.
What the preload made is frozen (``gc.freeze``) before the first fork: a proc's garbage
collections never walk it, so they stay short and leave its memory shared; the proc's
finalization unfreezes it (``proc.finalize``).
"""

from __future__ import annotations

import argparse
import array
import gc
import json
import os
import selectors
import signal
import socket
import sys
import traceback
from importlib import import_module

from .. import lifeline
from ..proc.stdio import RECORD_FD_ENV
from ..protocol import forkserver_ops as ops

PRELOAD_ENV = "MONARCH_NB_PROC_PRELOAD"  # comma-separated modules every proc of the host imports
PROC_MODULE = "monarch_nb.proc"  # what ``python -m`` would run: its ``__main__``


# What every proc imports: its runtime, and the API a user's actor module imports its
# base class from (``from monarch_nb.actor import Actor``; ~50-90 ms of the client layer,
# which each proc paid at its first actor: 4.6 s for an actor mesh on 128 procs here).
# By name: the host layer does not use the API, it only warms it up for its procs.
ALWAYS_PRELOADED = (PROC_MODULE + ".__main__", "monarch_nb.actor")


def preload(extra: str) -> tuple[list[str], dict[str, str]]:
    """Import what every proc imports, then the modules named in ``extra`` (commas);
    returns (imported, {module: why it failed})."""
    for name in ALWAYS_PRELOADED:
        import_module(name)
    imported, failed = [PROC_MODULE], {}
    for name in (n.strip() for n in extra.split(",")):
        if not name:
            continue
        try:
            import_module(name)
            imported.append(name)
        except Exception as e:  # noqa: BLE001 - a preload is an optimisation: the proc imports it itself
            failed[name] = f"{type(e).__name__}: {e}"
    return imported, failed


def _send(sock: socket.socket, **message) -> None:
    sock.send(json.dumps(message).encode())


def _receive(sock: socket.socket) -> tuple[dict, list[int]] | None:
    """The next start request and its descriptors; None when the agent is gone."""
    fds = array.array("i")
    data, ancdata, _, _ = sock.recvmsg(ops.MAX_DATAGRAM, socket.CMSG_SPACE(ops.FDS_PER_START * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    return json.loads(data), list(fds)


def _run_proc(request: dict, fds: list[int]) -> None:
    """In the forked child: become what ``python -m monarch_nb.proc ARGV`` would be,
    with the request's environment, working directory and standard streams. Never
    returns."""
    try:
        out, err, records = fds
        os.setsid()  # its own process group: what it starts ends with it
        signal.signal(signal.SIGINT, signal.default_int_handler)  # (ignored by the forkserver)
        devnull = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((devnull, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        env = dict(request[ops.ENV])
        env[RECORD_FD_ENV] = str(records)  # its number in this process
        os.environ.clear()
        os.environ.update(env)
        if request.get(ops.CWD):
            os.chdir(request[ops.CWD])
        path = [os.getcwd(), *_path_entries(env.get("PYTHONPATH", "")), *_BASE_PATH]  # as `python -m` builds it
        if not _as_started(env, path):
            os.set_inheritable(records, True)
            os.execve(sys.executable, [sys.executable, "-m", PROC_MODULE, *request[ops.ARGV]], env)
        sys.path[:] = path
        entry = sys.modules[PROC_MODULE + ".__main__"]
        sys.argv = [entry.__file__ or PROC_MODULE, *request[ops.ARGV]]
        sys.modules["__main__"] = entry  # (its own name stays: its code ran at the preload, not as a script)
        _reseed()
        entry.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - the child must never return into the forkserver's loop
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _path_entries(pythonpath: str) -> list[str]:
    return [p for p in pythonpath.split(os.pathsep) if p]


# sys.path as the interpreter made it without the forkserver's own PYTHONPATH and `-m`
# entry (set in main): what a proc's own entries go before.
_BASE_PATH: list[str] = []
_STARTED_WITH: dict[str, str] = {}  # the forkserver's PYTHON* variables other than PYTHONPATH


def _python_vars(env) -> dict[str, str]:
    """What of an environment an interpreter reads only at start, but PYTHONPATH (which
    only builds sys.path): PYTHONHASHSEED, PYTHONHOME, PYTHONSAFEPATH..."""
    return {k: v for k, v in env.items() if k.startswith("PYTHON") and k != "PYTHONPATH"}


def _as_started(env: dict[str, str], path: list[str]) -> bool:
    """Whether this process is what ``python -m`` with ``env`` would be: the same
    start-time variables, and every module it imported found at the same file under
    ``path`` (a proc whose PYTHONPATH or working directory puts another copy of one
    first must import that copy: it is started fresh instead)."""
    if _python_vars(env) != _STARTED_WITH:
        return False
    from importlib.machinery import PathFinder
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        if "." in name or spec is None or spec.name != name or not spec.has_location:
            continue
        found = PathFinder.find_spec(name, path)
        if found is None or found.origin != spec.origin:
            return False
    return True


def _reseed() -> None:
    """Generators a preloaded module seeded at import: each proc gets its own, as a
    started interpreter would (Python reseeds ``random`` at fork itself)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def serve(sock: socket.socket) -> None:
    """Fork a proc per request until the agent closes the socket; report exits."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # (a handler, so that the wakeup fd hears it)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    try:
        while True:
            for key, _ in selector.select():
                if key.fileobj is wake_read:
                    os.read(wake_read, 4096)
                    _report_exits(sock)
                    continue
                received = _receive(sock)
                if received is None:
                    return
                request, fds = received
                try:
                    pid = os.fork()
                except OSError as e:
                    _send(sock, **{ops.ERROR: f"fork failed: {e}"})
                    pid = -1
                if pid == 0:
                    selector.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for fd in (wake_read, wake_write, sock.fileno()):
                        os.close(fd)
                    _run_proc(request, fds)
                for fd in fds:
                    os.close(fd)
                if pid > 0:
                    _send(sock, **{ops.PID: pid})
                _report_exits(sock)
    finally:
        selector.close()


def _report_exits(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, **{ops.EXITED: pid, ops.CODE: os.waitstatus_to_exitcode(status)})


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m monarch_nb.host.forkserver")
    parser.add_argument("--cluster-dir", required=True, help="the cluster's (names the process, like its others)")
    parser.add_argument("--ppid", type=int, required=True, help="the host agent's pid: this dies with it")
    parser.add_argument("--fd", type=int, required=True, help="the SOCK_SEQPACKET socket to the agent")
    args = parser.parse_args()
    sock = socket.socket(fileno=args.fd)
    # Not lifeline's watchdog thread: a forkserver must have no thread when it forks.
    lifeline.die_with_parent(args.ppid, signal.SIGKILL, watchdog=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the agent's group is the agent's to handle
    own = set(_path_entries(os.environ.get("PYTHONPATH", "")))
    _BASE_PATH[:] = [p for p in sys.path[1:] if p not in own]
    _STARTED_WITH.update(_python_vars(os.environ))
    imported, failed = preload(os.environ.get(PRELOAD_ENV, ""))
    import threading
    if threading.active_count() != 1:  # a preload started a thread: forking now could deadlock a child
        _send(sock, **{ops.READY: [], ops.ERROR: f"a preloaded module started a thread "
                                                 f"({', '.join(t.name for t in threading.enumerate())})"})
        return
    # What the preload made lives as long as the procs (modules, classes, functions):
    # frozen, a proc's full collection no longer walks it (with torch preloaded ~170,000
    # objects, ~0.1 s of CPU in every full gc.collect() of every rank) nor writes to
    # their headers, which made each proc copy pages it shared with its siblings (+30 MiB
    # each; bench/bench_forkserver.py). Python's own recipe for a parent that forks (the
    # gc module's docs); the garbage the imports left is collected first, not kept.
    gc.collect()
    gc.freeze()
    _send(sock, **{ops.READY: imported, ops.PRELOAD_FAILED: failed})
    serve(sock)


if __name__ == "__main__":
    try:
        main()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the host agent is gone (its cluster stopped while this preloaded): nothing to serve, nothing to say
