"""What a host agent and its forkserver (``monarch_nb.host.forkserver``) say to each
other: JSON objects, one per datagram of a private ``SOCK_SEQPACKET`` socket pair (no
key: nobody else holds the socket), a start request carrying the proc's stdout,
stderr and record descriptors as ``SCM_RIGHTS``.

agent → forkserver: ``{ARGV, ENV, CWD}`` with 3 descriptors: fork a proc.
forkserver → agent: ``{READY}`` once, after its preloads; then, in request order,
``{PID}`` or ``{ERROR}`` per request, and ``{EXITED, CODE}`` when a proc it forked ends
(``CODE``: an exit status, or minus the signal that ended it, as ``Popen.returncode``)."""

from __future__ import annotations

# agent -> forkserver: start a proc
ARGV = "argv"  # the proc's arguments after ``python -m monarch_nb.proc``
ENV = "env"  # its whole environment
CWD = "cwd"  # its working directory, or null for the forkserver's

# forkserver -> agent
READY = "ready"  # preloading done: the modules it imported (list of names), or why not usable
PRELOAD_FAILED = "preload_failed"  # READY's company: {module: error} for preloads that failed to import
PID = "pid"  # the forked proc's pid (answers one start request, in order)
ERROR = "error"  # the start request could not be served (the fork failed): why
EXITED = "exited"  # a proc's pid: it ended
CODE = "code"  # EXITED's status

MAX_DATAGRAM = 1 << 20  # bytes: a request is its environment and a few arguments
FDS_PER_START = 3  # stdout, stderr, records
