"""Lines printed by actors, delivered to the client whose call caused them.

Every call this client sends carries an *origin* (``CLIENT_ID:CELL``, see
``ClientRuntime.origin``); actors tag what they print while handling it, and the hub
forwards those lines to this process's event inbox (``events.EventReceiver``), which
hands them to :class:`LogLines`. It *folds* them: the same text from several ranks of
a mesh within ``FOLD_WINDOW_S`` becomes one line naming the ranks (``[trainers 0-7]
epoch 1 done``). Lines that differ are never merged and nothing is dropped. Folded
lines go to a *sink*: by default this process's stdout/stderr; the notebook extension
routes them to the cell that made the call (``ClientRuntime.set_line_sink``).
"""

from __future__ import annotations

import _thread
import collections
import re
import sys
import threading
import time
from typing import Callable

from ..mesh.ranks import format_ranks
from ..protocol.records import LOG_FIELDS
from ..wire.interrupts import protected, sleep_on

FOLD_WINDOW_S = 0.1
# A line that two or more ranks of a mesh have printed is likely printed by the rest
# too: it waits up to this long for them (a loaded machine runs some ranks late),
# unless all of them joined earlier. A line printed by one rank waits FOLD_WINDOW_S.
FOLD_HOLD_S = 1.0
# How far back (in pending lines) a late rank's line may still join a group.
_MAX_REORDER = 512
# How long a text's per-rank counts are kept after its last printing while its ranks have
# printed it unequally often (a group was shown before a late rank's line came).
FOLD_FORGET_S = 10.0
# How long wait_for waits at least for a sink showing lines on the event thread, also
# once its own timeout is spent (a sink writes to a terminal or a cell: milliseconds).
EMIT_WAIT_S = 1.0

# Monarch's tag on an actor's log records (``proc.log_prefix``): the line's own
# ``[mesh rank]`` says the same, and a tag naming the rank would keep ranks from folding.
_ACTOR_TAG = re.compile(r"\[actor=\S+ \S+\{[^{}]*\}\] ")

# indices of a record as the hub sends it
SEQ, TIME, HOST, PROC, STREAM, MESH, RANK, ORIGIN, TEXT, SIZE = range(len(LOG_FIELDS))


class Folded:
    """One line to show: ``text`` from ``ranks`` of ``mesh`` on ``stream``."""

    __slots__ = ("mesh", "stream", "origin", "text", "occurrence", "ranks", "first", "size")

    def __init__(self, mesh, stream, origin, text, rank, first, size=None, occurrence=0):
        self.mesh, self.stream, self.origin, self.text = mesh, stream, origin, text
        self.occurrence = occurrence  # which time each of its ranks printed this text (0: the first)
        self.ranks = [] if rank is None else [rank]
        self.first = first
        self.size = size  # actors in the mesh: once that many ranks joined, nothing more can

    def complete(self) -> bool:
        return self.size is not None and len(self.ranks) >= self.size

    def prefix(self) -> str:
        ranks = format_ranks(self.ranks)
        return f"[{self.mesh} {ranks}]" if ranks else f"[{self.mesh}]"

    def __str__(self) -> str:
        return f"{self.prefix()} {self.text}"


class Folder:
    """Groups identical lines from different ranks that arrive within ``window``
    seconds (``hold`` once two ranks joined), keeping every rank's own lines in order.
    A group that every rank of its mesh has joined is shown at once (a one-actor mesh's
    lines never wait).

    A rank's n-th printing of a text joins the other ranks' n-th printing of it: a rank
    that prints ``tick`` three times in a burst makes three groups, and each other rank's
    first ``tick`` joins the first of them, not the newest (which would mix one rank's
    burst with another's earlier line). Counts are kept while a text has lines pending,
    and after that until every rank of its mesh has printed it as often as the others (or
    ``FOLD_FORGET_S`` after its last printing). A group shown before a late rank's line
    came (its window passed, or a cell's end took it) must not start that rank's count
    again: its late line would count as its first, and each later printing of the text
    by it would pair with the other ranks' one before (``[gen 0-1,4-5] x`` and
    ``[gen 2-3] x`` for every call after)."""

    def __init__(self, window: float = FOLD_WINDOW_S, hold: float = FOLD_HOLD_S):
        self.window = window
        self.hold = max(window, hold)
        self.enabled = True
        self._pending: list[Folded] = []
        self._open: dict[tuple, int] = {}  # (mesh, stream, origin, text, occurrence) -> index in _pending
        self._last: dict[tuple, int] = {}  # (mesh, stream, origin, rank) -> index of its latest line
        # (mesh, stream, origin, text) -> its counts, the least recently printed first
        self._printed: collections.OrderedDict[tuple, _Printed] = collections.OrderedDict()
        self._touched: set[tuple] = set()  # texts printed since the last take, or pending at it
        self._latest = 0.0  # the latest ``now`` given to add

    def add(self, record: list, now: float) -> None:
        mesh, rank, stream, origin, text = record[MESH], record[RANK], record[STREAM], record[ORIGIN], record[TEXT]
        text = _ACTOR_TAG.sub("", text, count=1)
        size = record[SIZE] if len(record) > SIZE else None
        what = (mesh, stream, origin, text)
        printed = self._printed.get(what)
        if printed is None:
            printed = self._printed[what] = _Printed(size)
        else:
            self._printed.move_to_end(what)
        printed.last = self._latest = now
        self._touched.add(what)
        occurrence = printed.times.get(rank, 0)
        printed.times[rank] = occurrence + 1
        key = (mesh, stream, origin, text, occurrence)
        who = (mesh, stream, origin, rank)  # stdout and stderr are separate pipes: no order between
        at = self._open.get(key) if self.enabled and rank is not None else None
        if at is not None and rank not in self._pending[at].ranks:
            at = self._joinable(at, rank, self._last.get(who, -1))
        if at is not None and rank not in self._pending[at].ranks:
            self._pending[at].ranks.append(rank)
        else:
            at = len(self._pending)
            self._pending.append(Folded(mesh, stream, origin, text, rank, now, size, occurrence))
            self._open[key] = at
        self._last[who] = at

    def _joinable(self, at: int, rank, last: int) -> int | None:
        """Index of the group at ``at`` once ``rank``, whose latest pending line is at
        ``last``, can join it without any rank's lines showing out of order; ``None``
        when it can't. Lines travel to the hub apart from replies, so on a loaded machine
        one rank's line of the previous call often arrives after the others' line of the
        next: that rank's pending lines after the group (and, for each of them, the lines
        of its other ranks before it) move ahead of the group, unless one of them shares
        a rank with the group."""
        if last < at:
            return at
        if last - at > _MAX_REORDER:
            return None
        group = self._pending[at]
        stream = (group.mesh, group.stream, group.origin)
        ahead = {rank}  # ranks whose lines in (at, i) move ahead of the group
        hoisted = set()
        for i in range(last, at, -1):  # from the rank's latest line back to the group
            g = self._pending[i]
            if (g.mesh, g.stream, g.origin) == stream and not ahead.isdisjoint(g.ranks):
                if not set(g.ranks).isdisjoint(group.ranks):
                    return None
                hoisted.add(i)
                ahead.update(g.ranks)
        order = [i for i in range(at + 1, last + 1) if i in hoisted]
        order += [at] + [i for i in range(at + 1, last + 1) if i not in hoisted]
        self._pending[at:last + 1] = [self._pending[i] for i in order]
        self._reindex()
        return at + len(hoisted)

    def _reindex(self) -> None:
        self._open, self._last = {}, {}
        for i, g in enumerate(self._pending):
            self._open[(g.mesh, g.stream, g.origin, g.text, g.occurrence)] = i
            for r in g.ranks:
                self._last[(g.mesh, g.stream, g.origin, r)] = i

    def take(self, now: float | None = None) -> list[Folded]:
        """Groups whose window has passed (all of them with ``now=None``), in order."""
        if now is None or not self.enabled:  # unfolded lines need not wait
            n = len(self._pending)
        else:
            n = 0
            while n < len(self._pending) and now >= self._due(self._pending[n]):
                n += 1
        clock = self._latest if now is None else now
        if n == 0:
            self._forget_stale(clock)
            return []
        done, self._pending = self._pending[:n], self._pending[n:]
        self._open = {k: i - n for k, i in self._open.items() if i >= n}
        self._last = {k: i - n for k, i in self._last.items() if i >= n}
        pending = self._pending_texts()
        for what in self._touched - pending:  # (not every text: those printed since the last take)
            printed = self._printed.get(what)
            if printed is not None and printed.even():
                del self._printed[what]
        self._touched &= pending
        self._forget_stale(clock, pending)
        return done

    def _pending_texts(self) -> set[tuple]:
        return {(g.mesh, g.stream, g.origin, g.text) for g in self._pending}

    def _forget_stale(self, now: float, pending: set[tuple] | None = None) -> None:
        """Drop the counts of texts not printed for ``FOLD_FORGET_S`` (the least recently
        printed come first) that have no line pending."""
        while self._printed:
            what, printed = next(iter(self._printed.items()))
            if now - printed.last <= FOLD_FORGET_S:
                return
            if pending is None:
                pending = self._pending_texts()
            if what in pending:
                return
            self._printed.popitem(last=False)

    def next_due(self) -> float | None:
        return self._due(self._pending[0]) if self._pending else None

    def _due(self, group: Folded) -> float:
        if group.complete():
            return 0.0
        return group.first + (self.hold if len(group.ranks) > 1 else self.window)


class _Printed:
    """How often each rank of a mesh printed one text (``Folder``)."""

    __slots__ = ("times", "size", "last")

    def __init__(self, size: int | None):
        self.times: dict = {}  # rank -> times printed
        self.size = size  # actors in the mesh (None: unknown; the ranks counted)
        self.last = 0.0  # when last printed

    def even(self) -> bool:
        """Every rank has printed it as often as the others: counting may start again."""
        return (self.size is None or len(self.times) >= self.size) and len(set(self.times.values())) <= 1


def fold_records(records: list[list], enabled: bool = True) -> list[Folded]:
    """Store records (oldest first) as lines to show, identical text from several ranks
    of a mesh folded into one wherever that keeps each rank's lines in order. Folded
    from the newest back: records end where the ranks' latest calls ended, but start
    wherever a query (``tail``, ``since``) or the store's ring cut them, often in the
    middle of a call, where ranks whose line fell before the cut would count each later
    printing of a text one less than the others (and fold with their next call's)."""
    folder = Folder(window=float("inf"))
    folder.enabled = enabled
    for record in reversed(records):
        record = list(record)
        record[ORIGIN] = None  # fold across cells and clients too
        folder.add(record, 0.0)
    lines = folder.take()
    lines.reverse()
    return lines


def tail_shown(fetch: Callable[[int], list[list]], tail: int, fold: bool = True) -> list[Folded]:
    """The last ``tail`` lines to show of a store: ``fetch(n)`` gives its last ``n``
    records (oldest first). Folded, a line stands for a record of each rank of its mesh,
    so ``tail`` times the largest mesh size among the records are read (the last
    ``tail`` records alone would show a line as if only the ranks that printed it last
    had printed it)."""
    wanted = tail
    while True:
        records = fetch(wanted)
        if not fold:
            return fold_records(records, False)
        needed = tail * max((r[SIZE] or 1 for r in records), default=1)
        if needed <= wanted or len(records) < wanted:
            return fold_records(records, True)[-tail:]
        wanted = needed


def mesh_extent(info: dict, name: str) -> dict[str, int] | None:
    """The extent of proc mesh or actor mesh (by its name) ``name`` of ``info``
    (``Cluster.info()``); ``None`` when it has none of that name."""
    if name in info["proc_meshes"]:
        return info["proc_meshes"][name]["extent"]
    return next((record["extent"] for key, record in info["actor_meshes"].items()
                 if key.rpartition("/")[2] == name), None)


def no_such_mesh(info: dict, name: str) -> str | None:
    """``None`` when ``name`` is a proc mesh or an actor mesh (by its name) of ``info``
    (``Cluster.info()``); else why a query of its lines found none, naming the meshes
    there are: what ``%monarch logs`` and ``monarch-nb logs`` say when nothing matched."""
    actor_names = {key.rpartition("/")[2] for key in info["actor_meshes"]}
    if name in info["proc_meshes"] or name in actor_names:
        return None
    known = sorted(info["proc_meshes"]) + sorted(info["actor_meshes"])
    return f"no mesh {name!r} and no lines of it in the store (meshes: {', '.join(known) or 'none'})"


def print_sink(lines: list[Folded]) -> None:
    """The default sink: this process's stdout/stderr, one prefixed line each."""
    for line in lines:
        print(line, file=sys.stderr if line.stream == "stderr" else sys.stdout, flush=True)


class LogLines:
    """Forwarded lines on their way to the sink: folded, then shown in order. The event
    receiver thread adds them and emits what is due; :meth:`wait_for` shows everything
    up to a batch the hub named."""

    def __init__(self):
        self.folder = Folder()
        self.sink: Callable[[list[Folded]], None] = print_sink
        self._seq: dict[str, int] = {}  # cluster id -> last batch number received
        self._lock = threading.Lock()  # guards folder and _seq
        self._waiters: set = set()  # wait_for's private locks, released when a batch arrives
        # Held from taking lines off the folder until the sink has shown them: wait_for
        # must not return (a script's exit, a cell's end) while the event thread holds
        # lines it took and has not shown, and lines show in the order they were taken.
        self._emit_lock = threading.Lock()

    def add(self, cluster_id: str, seq: int, records: list[list]) -> None:
        """Batch ``seq`` of ``cluster_id``'s forwarded records arrived."""
        now = time.time()
        with self._lock:
            for record in records:
                self.folder.add(record, now)
            self._seq[cluster_id] = seq
            for waiter in list(self._waiters):
                try:
                    waiter.release()
                except RuntimeError:  # already woken
                    pass

    def next_due(self) -> float | None:
        """When (epoch seconds) the oldest pending group is due; ``None``: none pending."""
        return self.folder.next_due()

    def emit_due(self, now: float) -> None:
        with self._emit_lock:
            with self._lock:
                lines = self.folder.take(now)
            self._emit(lines)

    def _emit(self, lines: list[Folded]) -> None:
        """Show ``lines``; the caller holds ``_emit_lock`` since it took them."""
        if lines:
            try:
                self.sink(lines)
            except Exception:  # a broken sink must not stop the thread
                import traceback

                traceback.print_exc()

    @protected
    def wait_for(self, cluster_id: str, seq: int, timeout: float) -> bool:
        """Wait until batch ``seq`` of ``cluster_id`` has arrived, then show everything
        pending (folded as far as it got), and wait for lines the event thread is
        showing to be shown. Returns False on timeout. Ctrl-C ends the wait with
        nothing shown twice or lost (what is pending shows later)."""
        deadline = time.monotonic() + timeout
        while True:
            waiter = _thread.allocate_lock()
            waiter.acquire()
            with self._lock:
                arrived = self._seq.get(cluster_id, 0) >= seq
                left = deadline - time.monotonic()
                if arrived or left <= 0:
                    break
                self._waiters.add(waiter)
            try:
                sleep_on(waiter, left)
            finally:
                self._waiters.discard(waiter)
        # The event thread may hold lines of this batch it took as due and has not shown
        # yet: returning before it has would let a script exit without them.
        if not self._emit_lock.acquire(True, max(deadline - time.monotonic(), EMIT_WAIT_S)):
            return False
        try:
            with self._lock:
                lines = self.folder.take()
            self._emit(lines)
        finally:
            self._emit_lock.release()
        return arrived
