"""How a host agent starts a proc: forked by the host's forkserver (``host.forkserver``)
when it is up and the proc runs the agent's interpreter (the forked child itself execs
a fresh one when its environment would import other files), else as a fresh
``python -m monarch_nb.proc``.

Either way the agent gets an object with what it uses of ``asyncio.subprocess.Process``:
``pid``, ``returncode``, ``wait()``, ``send_signal()``, ``kill()``.
``MONARCH_NB_FORKSERVER=0`` turns the forkserver off (every proc started fresh).
"""

from __future__ import annotations

import array
import asyncio
import collections
import json
import os
import signal
import socket
import sys
from typing import Protocol

from ..protocol import forkserver_ops as ops

FORKSERVER_ENV = "MONARCH_NB_FORKSERVER"  # "0": start every proc as a fresh interpreter
READY_TIMEOUT_S = 60.0  # a forkserver not done preloading by then is not waited for


class ProcProcess(Protocol):
    pid: int

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


class ForkedProc:
    """A proc the forkserver forked: its exit status comes from the forkserver (or, if
    the forkserver died first, from this process, which the proc is re-parented to)."""

    def __init__(self, pid: int, exited: asyncio.Future):
        self.pid = pid
        self._exited = exited

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass  # exited; its status is on its way

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ProcLauncher:
    """Starts procs for one host agent (``start``); ``close`` ends its forkserver."""

    def __init__(self, who: str, cluster_dir: str):
        self._who = who  # for messages: "host agent N"
        self._cluster_dir = cluster_dir  # (on the forkserver's command line, as on every process of the cluster)
        self._sock: socket.socket | None = None
        self._server: asyncio.subprocess.Process | None = None
        self._ready: asyncio.Future | None = None  # True once the forkserver can serve
        self._starting: collections.deque[asyncio.Future] = collections.deque()
        self._forked: dict[int, asyncio.Future[int]] = {}  # pid of a live forked proc -> its exit status
        self.forked = self.started = 0  # procs forked / started fresh (for benches and tests)

    async def open(self) -> None:
        """Start the forkserver (it preloads in the background; ``start`` waits for it)."""
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        if os.environ.get(FORKSERVER_ENV, "1") == "0":
            self._ready.set_result(False)
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._server = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "monarch_nb.host.forkserver", "--cluster-dir", self._cluster_dir,
                "--ppid", str(os.getpid()),
                "--fd", str(theirs.fileno()), pass_fds=(theirs.fileno(),), stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True)  # a signal to the agent's group is the agent's to handle
        except OSError as e:
            ours.close()
            self._unusable(f"could not start: {e}")
            return
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        loop.add_reader(ours.fileno(), self._readable)

    def pids(self) -> set[int]:
        """The forkserver's pid, if running (a child of the agent that is not a proc)."""
        return {self._server.pid} if self._server is not None and self._server.returncode is None else set()

    async def start(self, argv: list[str], env: dict[str, str], cwd: str | None, stdout: int, stderr: int,
                    records: int, python: str | None = None) -> ProcProcess:
        """A proc running ``python -m monarch_nb.proc ARGV --ppid PARENT`` with ``env``,
        in ``cwd``, its stdout, stderr and record channel on the given descriptors
        (which the caller still closes). Raises ``OSError`` if it cannot be started."""
        python = python or sys.executable
        if python == sys.executable and await self._forkserver_ready():
            sock = self._sock
            assert sock is not None and self._server is not None
            started = asyncio.get_running_loop().create_future()
            self._starting.append(started)
            request = json.dumps({ops.ARGV: [*argv, "--ppid", str(self._server.pid)], ops.ENV: env,
                                  ops.CWD: cwd}).encode()
            try:
                sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                          array.array("i", [stdout, stderr, records]))])
            except OSError as e:  # (a full socket buffer: thousands of starts at once) start it fresh
                self._starting.remove(started)
                print(f"monarch_nb {self._who}: forkserver request failed ({e}); starting the proc fresh",
                      file=sys.stderr)
            else:
                proc = await started
                self.forked += 1
                return proc
        self.started += 1
        return await asyncio.create_subprocess_exec(
            python, "-m", "monarch_nb.proc", *argv, "--ppid", str(os.getpid()), env=env, cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL, stdout=stdout, stderr=stderr, pass_fds=(records,),
            start_new_session=True)  # its own process group: what it starts ends with it

    async def _forkserver_ready(self) -> bool:
        if self._ready is None or self._sock is None:
            return False
        try:
            return await asyncio.wait_for(asyncio.shield(self._ready), READY_TIMEOUT_S)
        except asyncio.TimeoutError:
            self._unusable(f"not ready after {READY_TIMEOUT_S:g} s")
            return False

    def _readable(self) -> None:
        sock = self._sock
        while sock is not None:
            try:
                data = sock.recv(ops.MAX_DATAGRAM)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._gone()
                return
            self._take(json.loads(data))

    def _take(self, message: dict) -> None:
        loop = asyncio.get_running_loop()
        if ops.READY in message:
            if message.get(ops.ERROR):
                self._unusable(message[ops.ERROR])
            else:
                for name, why in (message.get(ops.PRELOAD_FAILED) or {}).items():
                    print(f"monarch_nb {self._who}: forkserver could not preload {name} ({why}); "
                          "each proc imports it itself", file=sys.stderr)
                if self._ready is not None and not self._ready.done():
                    self._ready.set_result(True)
        elif ops.PID in message or ops.ERROR in message:
            started = self._starting.popleft()
            if ops.PID in message:  # (before any EXITED of that pid: the forkserver sends in order)
                exited = self._forked[message[ops.PID]] = loop.create_future()
                if started.cancelled():  # its spawn was given up (the agent is stopping): no orphan
                    ForkedProc(message[ops.PID], exited).kill()
                else:
                    started.set_result(ForkedProc(message[ops.PID], exited))
            elif not started.cancelled():
                started.set_exception(OSError(message[ops.ERROR]))
        elif ops.EXITED in message:
            ended = self._forked.pop(message[ops.EXITED], None)
            if ended is not None and not ended.done():
                ended.set_result(message[ops.CODE])

    def _unusable(self, why: str) -> None:
        print(f"monarch_nb {self._who}: forkserver unusable ({why}); procs start as fresh interpreters",
              file=sys.stderr)
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(False)
        self._close_socket()

    def _gone(self) -> None:
        """The forkserver exited: its procs died with it (``PR_SET_PDEATHSIG``) and are
        re-parented here, the child subreaper; their statuses are read here."""
        self._unusable("it exited")
        while self._starting:
            started = self._starting.popleft()
            if not started.cancelled():
                started.set_exception(OSError("the forkserver exited"))
        if self._forked:
            asyncio.ensure_future(self._reap_orphaned(dict(self._forked)))

    async def _reap_orphaned(self, forked: dict[int, asyncio.Future]) -> None:
        if self._server is not None:
            await self._server.wait()  # after its exit, its children are ours
        loop = asyncio.get_running_loop()
        for pid, exited in forked.items():
            try:
                _, status = await loop.run_in_executor(None, os.waitpid, pid, 0)
                code = os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                code = -signal.SIGKILL  # reaped elsewhere: it died with the forkserver
            if not exited.done():
                exited.set_result(code)

    def _close_socket(self) -> None:
        if self._sock is not None:
            try:
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            except RuntimeError:
                pass  # no loop: closing at exit
            self._sock.close()
            self._sock = None

    async def close(self) -> None:
        """End the forkserver (after the procs: it is their parent)."""
        self._close_socket()  # it exits on EOF
        if self._server is not None and self._server.returncode is None:
            try:
                await asyncio.wait_for(self._server.wait(), 5.0)
            except asyncio.TimeoutError:
                self._server.kill()
                await self._server.wait()

