"""The ``monarch`` kernelspec: where its files are, and writing it for this interpreter.

The spec (``kernel.json`` and logos) lives in the repository's top-level ``kernel/``
folder and is shipped as wheel data into ``<prefix>/share/jupyter/kernels/monarch``, so
installing the package, plainly or editable, is enough for Jupyter in that environment
to list "Monarch (Python 3)" (as ipykernel does for ``python3``). Its ``argv`` starts
with ``python``, which jupyter_client replaces by the interpreter running Jupyter.

``install_kernel`` is for the other cases (a Jupyter in another environment, a user-wide
kernel): it writes a copy whose ``argv`` names this interpreter.
"""

from __future__ import annotations

import json
import shutil
import site
import sys
import tempfile
from pathlib import Path

NAME = "monarch"
_SHARE = Path("share", "jupyter", "kernels", NAME)


def source_dir() -> Path:
    """The shipped spec folder: ``kernel/`` beside the package in a source checkout (an
    editable install), else the wheel's data under this environment's or the user's
    prefix. Raises ``FileNotFoundError`` when none is there (a broken install)."""
    candidates = [Path(__file__).resolve().parent.parent / "kernel",
                  Path(sys.prefix) / _SHARE, Path(site.getuserbase()) / _SHARE]
    for folder in candidates:
        if (folder / "kernel.json").is_file():
            return folder
    raise FileNotFoundError(f"the monarch kernelspec is in none of {', '.join(map(str, candidates))}; "
                            "reinstall the package: pip install --force-reinstall monarch_nb")


def write(kernel_dir: Path, name: str = NAME) -> None:
    """Write the kernelspec ``name`` (``monarch``, with its logos, or ``python3``) into
    ``kernel_dir``, its ``argv`` naming this interpreter."""
    kernel_dir.mkdir(parents=True, exist_ok=True)
    if name == NAME:
        source = source_dir()
        for logo in source.glob("logo-*"):
            shutil.copyfile(logo, kernel_dir / logo.name)
        spec = json.loads((source / "kernel.json").read_text())
    else:
        spec = {"argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3", "language": "python"}
    spec["argv"][0] = sys.executable
    (kernel_dir / "kernel.json").write_text(json.dumps(spec, indent=1))


def write_data_dir(root: str | Path) -> None:
    """Make ``root`` a Jupyter data dir (for ``JUPYTER_PATH``) whose ``python3`` and
    ``monarch`` kernels are this interpreter, so a notebook runs with the packages of
    the environment ``monarch-nb`` is installed in. The caller owns (and removes) it."""
    for name in ("python3", NAME):
        write(Path(root, "kernels", name), name)


def install_kernel(user: bool = False, sys_prefix: bool = False, prefix: str | None = None) -> str:
    """Install the ``monarch`` kernelspec for this interpreter with jupyter_client;
    returns where. Default: into this environment when it is a virtualenv, else for the
    user. Raises ``ImportError`` without jupyter_client (the ``notebook`` extra)."""
    from jupyter_client.kernelspec import KernelSpecManager

    if not (user or sys_prefix or prefix):
        sys_prefix = sys.prefix != sys.base_prefix
        user = not sys_prefix
    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp, NAME))
        return KernelSpecManager().install_kernel_spec(str(Path(tmp, NAME)), NAME, user=user,
                                                       prefix=sys.prefix if sys_prefix else prefix)
