"""Progress for waits longer than about a second: how many ranks have answered.

``Future.get()`` on a call over several ranks waits quietly for ``SHOW_AFTER_S``; if
the call is still running then, a bar appears and counts the ranks done until the
call completes. Where the bar goes is the runtime's bar factory
(``ClientRuntime.set_bar_factory``): a rich bar on an interactive terminal by default,
an ipywidgets bar in a notebook (the notebook extension's), nothing when output is not
a terminal.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Protocol

from ..wire.mailbox import Mailbox

SHOW_AFTER_S = 1.0
UPDATE_S = 0.1


class Bar(Protocol):
    def update(self, done: int) -> None: ...

    def close(self) -> None: ...


class _RichBar:
    def __init__(self, description: str, total: int, started: float | None = None):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("ranks"), TimeElapsedColumn(), transient=True)
        self._task = self._progress.add_task(description, total=total)
        self._progress.start()

    def update(self, done: int) -> None:
        self._progress.update(self._task, completed=done)

    def close(self) -> None:
        self._progress.stop()


# ``factory(description, total, started=...)``: a bar for ``total`` ranks whose wait began at
# ``started`` (``time.monotonic()``: a bar shows only after SHOW_AFTER_S, and its elapsed
# time counts from the wait's start), or ``None`` where nothing can show one.
BarFactory = Callable[..., "Bar | None"]


def terminal_bar(description: str, total: int, started: float | None = None) -> Bar | None:
    """The default bar factory: a rich bar on an interactive terminal, else none."""
    return _RichBar(description, total, started) if sys.stderr.isatty() else None


def wait(mailbox: Mailbox, factory: BarFactory, done: Callable[[], bool], timeout: float | None, description: str,
         total: int, count: Callable[[], int]) -> bool:
    """``mailbox.wait(done, timeout)``, showing a bar made by ``factory`` of
    ``count()``/``total`` ranks done once the wait has lasted ``SHOW_AFTER_S``.
    Returns ``done()``."""
    if total < 2:
        return mailbox.wait(done, timeout)
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    if mailbox.wait(done, SHOW_AFTER_S if timeout is None else min(timeout, SHOW_AFTER_S)):
        return True
    if deadline is not None and time.monotonic() >= deadline:
        return False
    bar = factory(description, total, started=started)
    if bar is None:
        return mailbox.wait(done, None if deadline is None else deadline - time.monotonic())
    try:
        while not done():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            mailbox.wait(done, UPDATE_S if left is None else min(left, UPDATE_S))
            bar.update(count())
    finally:
        bar.update(count())
        bar.close()
    return done()


class Later:
    """A bar (made by ``factory``) for a wait driven elsewhere: :meth:`tick` (called
    while waiting) shows it once ``SHOW_AFTER_S`` have passed and updates it with
    ``count()``."""

    def __init__(self, factory: BarFactory, description: str, total: int, count: Callable[[], int | None]):
        self._factory = factory
        self._description, self._total, self._count = description, total, count
        self._started = time.monotonic()
        self._bar: Bar | None = None

    def tick(self) -> None:
        if self._total < 2 or time.monotonic() - self._started < SHOW_AFTER_S:
            return
        if self._bar is None:
            self._bar = self._factory(self._description, self._total, started=self._started)
            if self._bar is None:
                self._total = 0  # nowhere to show it: stop trying
                return
        done = self._count()
        if done is not None:
            self._bar.update(done)

    def close(self, done: int | None) -> None:
        """Finish the bar (if shown) at ``done`` (``None``: where it got to)."""
        if self._bar is not None:
            if done is not None:
                self._bar.update(done)
            self._bar.close()
