"""Progress bars in the notebook: an ipywidgets bar under the cell that waits."""

from __future__ import annotations

import time

from ..client.runtime import runtime


class WidgetBar:
    """``[=====    ] trainers.train: 5/8 ranks done``, then the time it took."""

    def __init__(self, description: str, total: int, started: float | None = None):
        from IPython.display import display
        from ipywidgets import HBox, IntProgress, Label

        self._description, self._total = description, total
        self._started = time.monotonic() if started is None else started  # the wait's start, not the bar's
        self._bar = IntProgress(value=0, min=0, max=total)
        self._label = Label(f"{description}: 0/{total} ranks done")
        display(HBox([self._bar, self._label]))

    def update(self, done: int) -> None:
        if done != self._bar.value:
            self._bar.value = done
            self._label.value = f"{self._description}: {done}/{self._total} ranks done"

    def close(self) -> None:
        finished = self._bar.value == self._total
        self._bar.bar_style = "success" if finished else "warning"
        self._label.value = (f"{self._description}: {self._bar.value}/{self._total} ranks done in "
                             f"{time.monotonic() - self._started:.1f} s")


def install() -> None:
    """Show progress as widget bars (when ipywidgets is installed; else as before)."""
    try:
        import ipywidgets  # noqa: F401 - the notebook extra; without it, no bar
    except ImportError:
        return
    runtime().set_bar_factory(WidgetBar)


def uninstall() -> None:
    runtime().set_bar_factory(None)
