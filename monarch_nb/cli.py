"""The ``monarch-nb`` command.

    monarch-nb run NOTEBOOK [-o OUT] [--timeout S]   execute a notebook headless
    monarch-nb cluster start|stop|list|status|recover [NAME]
    monarch-nb logs [NAME] [MESH] [--ranks R] [--tail N] [--grep RE] [-f]
    monarch-nb kernel install [--user | --sys-prefix | --prefix P]
    monarch-nb version
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from . import cluster_cli, kernelspec


def run_notebook(path: str | Path, output: str | Path | None = None, timeout: float = 600.0) -> Path:
    """Execute the notebook at ``path`` in a fresh kernel, cell by cell, with the
    notebook's directory as working directory; write the executed copy to ``output``
    (default ``NAME.executed.ipynb`` beside it) and return its path.

    Raises ``nbclient.exceptions.CellExecutionError`` when a cell fails (the executed
    copy, with the error, is written first) and ``ImportError`` without the
    ``notebook`` extra (``pip install 'monarch_nb[notebook]'``).
    """
    try:
        import jupyter_client
        import nbclient
        import nbformat
        from jupyter_client.utils import run_sync
    except ImportError as e:
        raise ImportError("running notebooks needs the notebook extra: pip install 'monarch_nb[notebook]'") from e
    path = Path(path)
    output = Path(output) if output else path.with_name(f"{path.stem}.executed.ipynb")
    nb = nbformat.read(path, as_version=4)
    previous = os.environ.get("JUPYTER_PATH")
    kernel = nb.metadata.get("kernelspec", {}).get("name", "python3")
    with tempfile.TemporaryDirectory(prefix="monarch-nb-kernels-") as kernels:
        # The kernel talks to this process only: over Unix sockets in this private
        # directory, not TCP ports any local user could connect to (ipykernel warns
        # about plain TCP).
        # Async, as nbclient's own default: with a blocking manager its per-cell timeout
        # never fired (a cell sleeping 20 s under --timeout 5 ran to its end).
        manager = jupyter_client.AsyncKernelManager(kernel_name=kernel if kernel == "monarch" else "python3",
                                                    transport="ipc", ip=os.path.join(kernels, "ipc"))
        client = nbclient.NotebookClient(nb, timeout=timeout, km=manager,
                                         resources={"metadata": {"path": str(path.parent.resolve())}})
        kernelspec.write_data_dir(kernels)
        os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [kernels, previous]))
        try:
            client.execute()
        finally:
            if manager.has_kernel:  # (a kernel manager given to nbclient is left running by it)
                run_sync(manager.shutdown_kernel)()
            nbformat.write(nb, output)
            if previous is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = previous
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="monarch-nb", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="execute a notebook headless and write the executed copy")
    run.add_argument("notebook")
    run.add_argument("-o", "--output", help="where to write the executed notebook "
                                           "(default: NAME.executed.ipynb beside it)")
    run.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per cell")
    sub.add_parser("version", help="print the version")
    cluster_cli.add_parser(sub)
    cluster_cli.add_logs_parser(sub)
    kernel = sub.add_parser("kernel", help="install the monarch Jupyter kernel")
    kernel_verbs = kernel.add_subparsers(dest="verb", required=True)
    install = kernel_verbs.add_parser("install", help="install the kernelspec 'monarch' for this Python")
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for the current user (~/.local/share/jupyter)")
    where.add_argument("--sys-prefix", action="store_true", help="into this environment (the default in a venv)")
    where.add_argument("--prefix", help="under this prefix (PREFIX/share/jupyter/kernels)")
    args = parser.parse_args(argv)
    if args.command == "cluster":
        return cluster_cli.run(args)
    if args.command == "logs":
        return cluster_cli.run_logs(args)
    if args.command == "kernel":
        installed = kernelspec.install_kernel(args.user, args.sys_prefix, args.prefix)
        print(f"installed kernelspec 'monarch' in {installed}")
        return 0
    if args.command == "version":
        from importlib.metadata import version

        print(version("monarch_nb"))
        return 0
    from .client import discovery

    running = set(discovery.running_names())
    try:
        out = run_notebook(args.notebook, args.output, args.timeout)
    except ImportError as e:
        print(f"monarch-nb: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # CellExecutionError carries the cell and the traceback
        print(f"monarch-nb: {args.notebook} failed:\n{e or repr(e)}", file=sys.stderr)
        _tell_clusters_left(args.notebook, running)
        return 1
    print(f"executed {args.notebook} -> {out}")
    _tell_clusters_left(args.notebook, running)
    return 0


def _tell_clusters_left(notebook: str, running_before: set[str]) -> None:
    """Name the retained clusters the notebook started and left running (a failed cell
    skips the notebook's own stop): they outlive the run, as retained clusters do, for
    inspection, until stopped."""
    from .client import discovery

    left = [name for name in discovery.running_names() if name not in running_before]
    for name in left:
        print(f"monarch-nb: {notebook} left retained cluster {name!r} running: inspect it with "
              f"monarch_nb.connect({name!r}), end it with `monarch-nb cluster stop {name}`", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
