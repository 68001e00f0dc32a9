"""Stand-ins for Monarch's public names that monarch_nb leaves out.

``from monarch_nb.actor import default_bootstrap_cmd`` works, as it does from
``monarch.actor``, so a Monarch program imports; using the name (calling it, reading an
attribute of it) raises ``NotImplementedError`` saying which name is missing and why,
instead of an ``ImportError``/``AttributeError`` far from the reason. The public
packages (``monarch_nb.actor``, ``monarch_nb.job``) hand these out from a module
``__getattr__`` built by :func:`module_getattr`; docs/compatibility.md lists them.
"""

from __future__ import annotations

from typing import Any, Callable, NoReturn


class Absent:
    """A Monarch name monarch_nb has not got: every use raises ``NotImplementedError``
    naming it (``monarch_nb has no monarch.actor.X: why``)."""

    def __init__(self, dotted: str, why: str):
        self._message = f"monarch_nb has no {dotted}: {why}"

    def _raise(self) -> NoReturn:
        raise NotImplementedError(self._message)

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._raise()

    def __getattr__(self, name: str) -> NoReturn:
        if name.startswith("__"):  # copy, pickle, inspect probing: not a use
            raise AttributeError(name)
        self._raise()

    def __repr__(self) -> str:
        return f"<absent: {self._message}>"


def module_getattr(module: str, absent: dict[str, str]) -> Callable[[str], Absent]:
    """A module ``__getattr__`` for ``module`` (``"monarch.actor"``) that answers each
    name of ``absent`` (name -> why monarch_nb leaves it out) with an :class:`Absent`
    and any other unknown name with the usual ``AttributeError``."""

    def __getattr__(name: str) -> Absent:
        if name in absent:
            return Absent(f"{module}.{name}", absent[name])
        raise AttributeError(f"module 'monarch_nb.{module.removeprefix('monarch.')}' has no attribute {name!r}")

    return __getattr__
