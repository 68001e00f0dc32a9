"""Summaries of a harness run: per file outcome counts, and failures grouped by cause."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

FAILING = ("failed", "error", "timeout", "crashed", "not collected")
OUTCOMES = ("passed", *FAILING, "skipped", "not run")


def cause(message: str, remote: str = "") -> str:
    """A failure's group: its first line (the exception raised in the actor or
    subprocess, for errors that carry one), with what varies between tests blurred so
    the same failure in two tests lands in one group."""
    if remote and remote.strip() not in message:
        kind = re.match(r"^(?:Failed: )?(?:\w+\.)*(\w+)", message)
        return f"{kind.group(1) if kind else 'error'} from: {cause(remote)}"
    text = re.sub(r"^Failed: (?=(?:\w+\.)*\w+: )", "", message)  # pytest.fail(f"{type}: {msg}")
    text = re.sub(r"^(?:[a-z_]\w*\.)+(?=[A-Z]\w*: )", "", text)  # monarch_nb.errors.InvalidRequest
    text = re.sub(r"0x[0-9a-fA-F]+", "0x…", text)
    text = re.sub(r"named '[^']*' exists \([^)]*\)", "named '…' exists", text)
    # monarch_nb names the actor class and lists its endpoints: the missing name is the cause
    text = re.sub(r"\b(?:\w+\.)*\w+ has no endpoint", "<actor> has no endpoint", text)
    text = re.sub(r" \(endpoints: [^)]*\)", "", text)
    text = re.sub(r"Actor call \S+ failed in \d+ of \d+ actor\(s\): .*", "Actor call <mesh.endpoint> failed", text)
    text = re.sub(r"\b(?:\w+\.)+(\w+) is not an endpoint", r"<actor>.\1 is not an endpoint", text)
    text = re.sub(r"\d{3,}", "N", text)
    return text[:200]


def summarize(tests: list[dict]) -> dict:
    """``tests``: dicts with file, nodeid, public, outcome, message (see run.py)."""
    files: dict[str, dict[str, Counter]] = defaultdict(lambda: {"public": Counter(), "internals": Counter()})
    groups: dict[str, list[str]] = defaultdict(list)
    skips: dict[str, list[str]] = defaultdict(list)
    for t in tests:
        files[t["file"]]["public" if t["public"] else "internals"][t["outcome"]] += 1
        if t["public"] and t["outcome"] in FAILING:
            groups[cause(t["message"], t.get("remote", ""))].append(t["nodeid"])
        elif t["public"] and t["outcome"] == "skipped":
            skips[cause(t["message"])].append(t["nodeid"])
    public = [t for t in tests if t["public"]]
    ran = [t for t in public if t["outcome"] != "not run"]  # -k leaves some out
    passed = sum(t["outcome"] == "passed" for t in ran)
    exercised = [t for t in ran if t["outcome"] != "skipped"]  # a skip (no CUDA) exercises nothing
    return {
        "tests": len(tests),
        "public": len(public),
        "internals": len(tests) - len(public),
        "public_ran": len(ran),
        "public_passed": passed,
        "public_pass_rate": round(passed / len(ran), 4) if ran else None,
        "public_exercised": len(exercised),
        "public_pass_rate_exercised": round(passed / len(exercised), 4) if exercised else None,
        "public_outcomes": dict(Counter(t["outcome"] for t in public)),
        "internals_outcomes": dict(Counter(t["outcome"] for t in tests if not t["public"])),
        "internals_reasons": dict(Counter(category for t in tests if not t["public"]
                                          for category in {r.split(":")[0] for r in t["reasons"]})),
        "files": {f: {k: dict(c) for k, c in v.items()} for f, v in sorted(files.items())},
        "failure_causes": [{"cause": c, "count": len(ids), "tests": ids}
                           for c, ids in sorted(groups.items(), key=lambda kv: -len(kv[1]))],
        "skip_reasons": [{"reason": c, "count": len(ids), "tests": ids}
                         for c, ids in sorted(skips.items(), key=lambda kv: -len(kv[1]))],
    }


def as_text(summary: dict, header: list[str]) -> str:
    lines = [*header, ""]
    rate = summary["public_pass_rate"]
    lines.append(f"tests: {summary['tests']}  public API: {summary['public']}  internals: {summary['internals']}")
    lines.append(f"public API passed: {summary['public_passed']} / {summary['public_ran']} run"
                 + (f" ({rate:.1%})" if rate is not None else ""))
    exercised = summary.get("public_pass_rate_exercised")
    if exercised is not None:
        lines.append(f"  of those not skipped: {summary['public_passed']} / {summary['public_exercised']} "
                     f"({exercised:.1%})")
    lines.append(f"public API outcomes: {_counts(summary['public_outcomes'])}")
    lines.append(f"internals outcomes: {_counts(summary['internals_outcomes'])}")
    lines.append("internals because they use (tests per kind): "
                 + ", ".join(f"{k} {n}" for k, n in sorted(summary["internals_reasons"].items(), key=lambda kv: -kv[1])))
    lines += ["", "per file (public API | internals):"]
    width = max((len(f) for f in summary["files"]), default=0)
    for f, v in summary["files"].items():
        lines.append(f"  {f:<{width}}  {_counts(v['public']) or '-'}  |  {_counts(v['internals']) or '-'}")
    lines += ["", "public API failures by cause (most frequent first):"]
    for g in summary["failure_causes"]:
        examples = ", ".join(t.split("::", 1)[-1] for t in g["tests"][:2])
        lines.append(f"  {g['count']:4d}  {g['cause']}")
        lines.append(f"        e.g. {examples}")
    if summary["skip_reasons"]:
        lines += ["", "public API skips:"]
        lines += [f"  {g['count']:4d}  {g['reason']}" for g in summary["skip_reasons"]]
    return "\n".join(lines) + "\n"


def _counts(counter: dict) -> str:
    return ", ".join(f"{k} {counter[k]}" for k in OUTCOMES if counter.get(k))
