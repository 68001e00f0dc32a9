"""Real Jupyter kernels for tests, driven through jupyter_client."""

from __future__ import annotations

import os
from pathlib import Path

from jupyter_client import KernelManager

from monarch_nb.cli import _python3_kernelspec_dir

TESTS = Path(__file__).resolve().parent


class CellError(AssertionError):
    """A cell raised in the kernel; the message is the kernel's traceback."""


class Kernel:
    """A python3 kernel of this interpreter, started in ``tests/`` with the test
    process's environment (so its isolated ``MONARCH_NB_HOME``)."""

    def __init__(self):
        os.environ["JUPYTER_PATH"] = _python3_kernelspec_dir()
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=str(TESTS))
        self._connect()

    def _connect(self) -> None:
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def run(self, code: str, timeout: float = 120) -> str:
        """Execute ``code`` as one cell; returns its stdout. Raises :class:`CellError`."""
        out: list[str] = []
        errors: list[str] = []

        def hook(msg):
            content = msg["content"]
            if msg["msg_type"] == "stream" and content["name"] == "stdout":
                out.append(content["text"])
            elif msg["msg_type"] == "error":
                errors.append("\n".join(content["traceback"]))

        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        if reply["content"]["status"] != "ok":
            raise CellError("\n".join(errors) or str(reply["content"]))
        return "".join(out)

    def restart(self) -> None:
        """``KernelManager.restart_kernel``: the old kernel process is killed."""
        self.kc.stop_channels()
        self.km.restart_kernel(now=True)
        self._connect()

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
