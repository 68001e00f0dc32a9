"""``$MONARCH_NB_HOME/config.toml``: settings written once instead of at every start.

One table per part: ``[slurm]`` (``allocators.slurm_config``: partition, account,
time, set-up lines...) and ``[logs]`` (``hub.logstore``: how much of the log store is
kept). A missing file is an empty configuration.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from . import cluster_dir

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

FILE = "config.toml"


def path() -> Path:
    return cluster_dir.home() / FILE


def table(name: str) -> dict[str, Any]:
    """The ``[name]`` table of the config file; ``{}`` without the file or the table.
    Raises ``ValueError`` naming the file for TOML it can't read, or naming
    ``MONARCH_NB_HOME`` when that is a file."""
    cluster_dir.check_home()  # (another user's home would be another user's settings)
    try:
        text = path().read_text()
    except FileNotFoundError:
        return {}
    except NotADirectoryError as e:  # the home is a file
        raise cluster_dir.bad_home(e) from None
    try:
        found = tomllib.loads(text).get(name, {})
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path()}: {e}") from None
    if not isinstance(found, dict):
        raise ValueError(f"{path()}: {name!r} must be a table ([{name}])")
    return found
