"""Reading what Slurm's commands print: hostlists, ``scontrol show`` records, ``squeue``
lines and ``sbatch --parsable`` answers. Pure text in, plain data out (no processes), so
it is tested on outputs recorded from several Slurm versions.
"""

from __future__ import annotations

import re

# Job states after which the job's processes are gone (or going) for good. Pending,
# running, configuring, completing, suspended, requeued... are not final.
FINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT"})

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed hostlist as names, in order: ``"node[01-04,07]"`` ->
    ``["node01", "node02", "node03", "node04", "node07"]``. Handles comma-separated
    lists (``"a1,b[2-3]"``), zero padding, suffixes (``"gpu[1-2]-ib"``) and several
    bracket groups (``"r[1-2]n[1-2]"``: their product, first group slowest).
    ``""`` and ``"(null)"`` give ``[]``. Raises ``ValueError`` for unbalanced brackets
    or a bad range."""
    hostlist = hostlist.strip()
    if hostlist in ("", "(null)", "None"):
        return []
    names: list[str] = []
    for item in _split_top_level(hostlist):
        names.extend(_expand_one(item))
    return names


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"bad hostlist {text!r}: nested brackets")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"bad hostlist {text!r}: ']' without '['")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"bad hostlist {text!r}: '[' without ']'")
    items.append(text[start:])
    return [i for i in items if i]


def _expand_one(item: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    prefix, ranges, rest = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    tails = _expand_one(rest)
    names: list[str] = []
    for part in ranges.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise ValueError(f"bad hostlist range {part!r} in {item!r}: use N or N-M")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"bad hostlist range {part!r} in {item!r}: {hi} < {lo}")
        width = len(lo) if lo.startswith("0") else 0  # "01-04" keeps two digits
        for n in range(int(lo), int(hi) + 1):
            names.extend(f"{prefix}{n:0{width}d}{tail}" for tail in tails)
    return names


def parse_scontrol(text: str) -> list[dict[str, str]]:
    """Records of ``scontrol show job|node|partition`` (multi-line or ``-o`` one-line
    form) as dicts of ``Key -> value`` strings, one per record.

    Records are separated by blank lines (multi-line form) or newlines (``-o``). Keys
    are split at the first ``=`` (``TRES=cpu=2,node=2`` -> ``"cpu=2,node=2"``); a word
    without ``=`` continues the previous value, because values such as job names and
    command paths may hold spaces. Slurm 2.x-20.x print ``Name=`` where later versions
    print ``JobName=``; both are kept and ``JobName`` is filled from ``Name``."""
    text = text.replace("\r\n", "\n")
    one_line = "\n\n" not in text.strip() and all(
        line.startswith(("JobId=", "NodeName=", "PartitionName=")) for line in text.strip().splitlines())
    chunks = text.strip().splitlines() if one_line else re.split(r"\n\s*\n", text.strip())
    records = []
    for chunk in chunks:
        record: dict[str, str] = {}
        last = None
        for line in chunk.splitlines():
            if not line.strip():
                continue
            for word in line.split():
                key, eq, value = word.partition("=")
                if eq and key and re.fullmatch(r"[A-Za-z][\w:/.\[\]-]*", key):
                    record[key] = value
                    last = key
                elif last is not None:
                    record[last] = f"{record[last]} {word}"
        if record:
            if "JobName" not in record and "Name" in record and "JobId" in record:
                record["JobName"] = record["Name"]
            records.append(record)
    return records


def job_state(record: dict[str, str]) -> tuple[str, str]:
    """``(state, reason)`` of one ``scontrol show job`` record: ``("PENDING",
    "Resources")``; a state with flags (``"CANCELLED by 0"``, ``"RUNNING+..."``) is cut
    to its base name. ``reason`` is ``""`` when Slurm says ``None``."""
    state = record.get("JobState", "UNKNOWN").split()[0].split("+")[0]
    reason = record.get("Reason", "None")
    return state, "" if reason in ("None", "(null)") else reason


def parse_sbatch(text: str) -> str:
    """The job id from ``sbatch --parsable`` (``"123"`` or ``"123;cluster"``) or plain
    ``sbatch`` (``"Submitted batch job 123"``). Raises ``ValueError`` when there is none."""
    for line in text.strip().splitlines()[::-1]:
        m = re.fullmatch(r"\s*(\d+)(?:;\S+)?\s*", line) or re.search(r"Submitted batch job (\d+)", line)
        if m:
            return m.group(1)
    raise ValueError(f"no job id in sbatch's output: {text.strip()!r}")


def parse_squeue(text: str, fields: list[str], sep: str = "|") -> list[dict[str, str]]:
    """Lines of ``squeue -h -o FORMAT`` where FORMAT joins the fields with ``sep``
    (e.g. ``%i|%j|%T|%r|%N``); ``fields`` names them. Lines that are not jobs (warnings,
    a header) are skipped."""
    rows = []
    for line in text.splitlines():
        parts = line.strip().split(sep)
        if len(parts) == len(fields) and parts[0][:1].isdigit():
            rows.append(dict(zip(fields, (p.strip() for p in parts))))
    return rows


def parse_version(text: str) -> tuple[int, int] | None:
    """``(major, minor)`` from ``srun --version`` (``"slurm 23.02.7"``, ``"slurm-wlm
    22.05.8"``), or None when the text names no version."""
    m = re.search(r"slurm\S*\s+(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None
