"""Real Jupyter kernels for tests, driven through jupyter_client."""

from __future__ import annotations

import collections
import os
import queue
import textwrap
import time
from pathlib import Path

from jupyter_client import KernelManager

# A notebook cell defining an actor whose endpoint has a line to break on
# (``Worker.compute:4``, ``y = ...``): the debugger tests and bench_break_after_restart.
WORKER = textwrap.dedent("""\
    from monarch_nb.actor import Actor, endpoint, context

    class Worker(Actor):
        @endpoint
        def compute(self, x):
            y = x + context().actor_instance.rank.rank
            return y
    """)

from monarch_nb.kernelspec import write_data_dir

TESTS = Path(__file__).resolve().parent


class CellError(AssertionError):
    """A cell raised in the kernel; ``ename``/``evalue`` name the error."""

    def __init__(self, content: dict, traceback: str):
        self.ename = content.get("ename")
        self.evalue = content.get("evalue")
        super().__init__(f"{self.ename}: {self.evalue}\n{traceback}")


class Kernel:
    """A kernel of this interpreter (``python3`` or ``monarch``), started in ``tests/``
    with the test process's environment (so its isolated ``MONARCH_NB_HOME``).

    Every IOPub message is kept by the request that caused it (``outputs[msg_id]``),
    so output that reaches an earlier cell later can be checked too."""

    def __init__(self, name: str = "python3", env: dict | None = None):
        specs = os.path.join(os.environ["MONARCH_NB_HOME"], "jupyter")  # removed with the run's home
        write_data_dir(specs)
        os.environ["JUPYTER_PATH"] = specs
        self.km = KernelManager(kernel_name=name)
        self.km.start_kernel(cwd=str(TESTS), env={**os.environ, **(env or {})})
        self.outputs: dict[str, list[dict]] = collections.defaultdict(list)
        self._connect()

    def _connect(self) -> None:
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def execute(self, code: str) -> str:
        """Send a cell; returns its msg_id at once."""
        return self.kc.execute(code)

    def _pump(self, timeout: float) -> dict | None:
        try:
            msg = self.kc.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            return None
        self.outputs[msg["parent_header"].get("msg_id")].append(msg)
        return msg

    def drain(self) -> None:
        """Read the IOPub messages waiting now (a kernel that publishes many keeps its
        queue below the high-water mark, past which new messages are dropped)."""
        while self._pump(0) is not None:
            pass

    def wait_for(self, condition, timeout: float = 60) -> bool:
        """Read IOPub until ``condition()`` holds or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while not condition():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._pump(min(left, 0.2))
        return True

    def finish(self, msg_id: str, timeout: float = 120) -> dict:
        """Wait for the cell to finish; returns its execute_reply content."""
        def idle():
            return any(m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"
                       for m in self.outputs[msg_id])

        assert self.wait_for(idle, timeout), f"cell {msg_id} did not finish within {timeout} s"
        while True:
            reply = self.kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply["content"]

    def text(self, msg_id: str, stream: str = "stdout") -> str:
        """What the cell wrote to ``stream`` (plus its text/plain results for stdout)."""
        parts = []
        for m in self.outputs[msg_id]:
            content = m["content"]
            if m["msg_type"] == "stream" and content["name"] == stream:
                parts.append(content["text"])
            elif stream == "stdout" and m["msg_type"] in ("execute_result", "display_data"):
                parts.append(content["data"].get("text/plain", "") + "\n")
        return "".join(parts)

    def run(self, code: str, timeout: float = 120) -> str:
        """Execute ``code`` as one cell; returns its stdout. Raises :class:`CellError`."""
        msg_id = self.execute(code)
        content = self.finish(msg_id, timeout)
        if content["status"] != "ok":
            errors = [m for m in self.outputs[msg_id] if m["msg_type"] == "error"]
            raise CellError(content, "\n".join("\n".join(e["content"]["traceback"]) for e in errors))
        return self.text(msg_id)

    def restart(self) -> None:
        """``KernelManager.restart_kernel``: the old kernel process is killed."""
        self.kc.stop_channels()
        self.km.restart_kernel(now=True)
        self.outputs.clear()  # message ids may repeat in the new kernel's session
        self._connect()

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
