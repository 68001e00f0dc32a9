"""Open files per proc, and a spawn under a given open-file limit.

    .venv/bin/python bench/bench_open_files.py [--procs 256] [--soft 1024] [--hard 1024]

Runs in a process whose RLIMIT_NOFILE is (``--soft``, ``--hard``; default: as it is), as
every process of its ephemeral cluster then is: spawns ``--procs`` procs on one host,
an actor on each, and calls them all once. Reports how long the spawn took (or how it
failed, and how soon), and the open files of the client, the hub, the host agent and
one proc, with each one's soft limit.

Runs in an isolated MONARCH_NB_HOME; exit status 1 if a process is left behind.
"""

from __future__ import annotations

from tidy import isolated_home, stop_and_check

_OWN_HOME = isolated_home()  # before monarch_nb is imported

import argparse  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import psutil  # noqa: E402

from monarch_nb.actor import Actor, MonarchNbError, endpoint  # noqa: E402


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x


def soft_limit(pid: int) -> str:
    with open(f"/proc/{pid}/limits") as f:
        return next(line.split()[3] for line in f if line.startswith("Max open files"))


def open_files() -> dict[str, str]:
    """Open files / soft limit of the client, hub, host agent and the first proc."""
    me = psutil.Process()
    found = {"client": me}
    for child in me.children(recursive=True):
        line = " ".join(child.cmdline())
        if child.cmdline()[1:3] == ["-m", "monarch_nb.host.forkserver"]:  # it, or a proc it forked
            kind = "proc" if child.parent().cmdline()[1:3] == ["-m", "monarch_nb.host.forkserver"] else "forkserver"
        else:
            kind = next((k for k in ("hub", "host", "proc") if f"monarch_nb.{k}" in line), None)
        if kind is not None:
            found.setdefault(kind, child)
    return {k: f"{p.num_fds()}/{soft_limit(p.pid)}" for k, p in found.items()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--procs", type=int, default=256)
    parser.add_argument("--soft", type=int, default=None)
    parser.add_argument("--hard", type=int, default=None)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (args.soft or soft, args.hard or hard))
    print(f"RLIMIT_NOFILE at start: {resource.getrlimit(resource.RLIMIT_NOFILE)}")

    from monarch_nb.client.cluster import Cluster

    cluster = Cluster.start_ephemeral()
    print(f"cluster up: open files/soft limit {open_files()}")
    started = time.monotonic()
    try:
        procs = cluster.this_host().spawn_procs(per_host={"gpus": args.procs}, name="many")
        spawned = time.monotonic() - started
        echo = procs.spawn("echo", Echo)
        assert echo.echo.call(1).get(timeout=600).values() == [1] * args.procs
        print(f"{args.procs} procs spawned in {spawned:.1f} s, actors spawned and called in "
              f"{time.monotonic() - started:.1f} s in all")
        print(f"open files/soft limit: {open_files()}")
        procs.stop()
    except MonarchNbError as e:
        print(f"spawn of {args.procs} procs failed after {time.monotonic() - started:.2f} s: "
              f"{type(e).__name__}: {e}")
    return stop_and_check(cluster, _OWN_HOME)


if __name__ == "__main__":
    sys.exit(main())
