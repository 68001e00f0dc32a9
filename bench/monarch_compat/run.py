"""Run Monarch's own actor-API tests against monarch_nb and report how many pass.

    PYTHONPATH=$PWD .venv/bin/python bench/monarch_compat/run.py \\
        --monarch /path/to/monarch            # a checkout, or a (bare) git dir
        [--files test_spmd.py ...] [-k EXPR] [--only public] [--timeout 60] [--out DIR]

Monarch's tests are never copied into this repository: each run extracts
``python/tests`` (and the public packages' ``__init__.py``, to tell public API from
internals) from the Monarch source given, into a temp dir. There ``import monarch...``
resolves to monarch_nb through shim.py (installed by a ``sitecustomize.py`` on
``PYTHONPATH``, so monarch_nb's procs and the tests' subprocesses get it too).
Monarch's ``conftest.py`` is left out: it only skips tensor-engine and disabled tests
and starts Monarch's crash-recovery plugin; plugin.py takes its place. Helper modules
of Monarch's tests that clean up through Monarch's internals are replaced by the
equivalents in ``stand_ins/`` (``proc_mesh_test_utils.py``).

Each test file runs in its own pytest process (pytest-asyncio in ``auto`` mode, as
Monarch configures it), each test under a timeout. If the process dies or hangs, the
running test counts as ``crashed`` and the file resumes after it. After each process,
any process still carrying this run's marker in its environment is reported as a
leftover and killed (they all descend from this run). Writes ``summary.json``,
``summary.txt`` and per-file pytest logs to ``--out``; prints the text summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from classify import PUBLIC_PACKAGES, PublicApi, classify_file  # noqa: E402
from report import as_text, summarize  # noqa: E402

# The actor-API test files of issue #14, relative to python/tests ...
FILES = ["test_python_actors.py", "test_actor_error.py", "test_proc_mesh.py", "test_host_mesh.py",
         "test_concurrent_endpoints.py", "test_spmd.py", "_monarch/test_value_mesh.py", "test_actor_shape.py",
         "test_cookbook.py", "test_supervision_hierarchy.py", "test_inter_mesh_ping_pong.py",
         "test_actor_logging.py", "test_client_shutdown.py",
         # ... and issue #28's: the job API, RDMABuffer/RDMAAction on CPU (their CUDA cases skip
         # without a GPU; test_rdma_unit.py is all CUDA cases), ports handed back to actors,
         # and controller de-duplication.
         "test_job.py", "test_rdma.py", "test_rdma_cpu_no_torch.py", "test_rdma_action.py",
         "test_port_reconstruction.py", "test_controller_dedup.py"]
PYTEST_INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
markers =
    oss_skip: marks tests to skip in OSS CI
"""
HANG_GRACE_S = 60  # beyond the test timeout, before a silent pytest process is killed
LEFTOVER_GRACE_S = 5


def extract(monarch: Path, into: Path) -> str:
    """Put Monarch's ``python/tests`` and public ``__init__.py`` files under ``into``;
    return the commit (or "unknown" for a checkout that is not a git work tree)."""
    inits = [f"python/{p.replace('.', '/')}/__init__.py" for p in PUBLIC_PACKAGES]
    if (monarch / "python" / "tests").is_dir():
        shutil.copytree(monarch / "python" / "tests", into / "python" / "tests")
        for init in inits:
            if (monarch / init).exists():
                (into / init).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(monarch / init, into / init)
        git = ["git", "-C", str(monarch)]
    else:
        git = ["git", f"--git-dir={monarch}"]
        archive = subprocess.run([*git, "archive", "HEAD", "python/tests", *inits], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    for conftest in (into / "python" / "tests").rglob("conftest.py"):
        conftest.unlink()
    for stand_in in (HERE / "stand_ins").glob("*.py"):  # Monarch test helpers built on its internals
        shutil.copy(stand_in, into / "python" / "tests" / stand_in.name)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    return head.stdout.strip() if head.returncode == 0 else "unknown"


def prepare_site(site: Path) -> None:
    """The folder put first on ``PYTHONPATH``: the shim, installed at startup, and the plugin."""
    site.mkdir(parents=True)
    shutil.copy(HERE / "shim.py", site / "monarch_compat_shim.py")
    shutil.copy(HERE / "plugin.py", site / "monarch_compat_plugin.py")
    (site / "sitecustomize.py").write_text("import monarch_compat_shim\nmonarch_compat_shim.install()\n")


def read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def leftovers(run_id: str) -> list[psutil.Process]:
    """Processes that inherited this run's marker, i.e. started by this run's tests."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get("MONARCH_COMPAT_RUN") == run_id:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def kill_leftovers(run_id: str) -> list[str]:
    """Describe, then kill, this run's processes still alive a few seconds after the
    pytest process ended (an ephemeral cluster may still be on its way down)."""
    deadline = time.time() + LEFTOVER_GRACE_S
    while (procs := leftovers(run_id)) and time.time() < deadline:
        time.sleep(0.5)
    described = []
    for proc in procs:
        try:
            described.append(f"{proc.pid}: {' '.join(proc.cmdline()[:6])}")
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(procs, timeout=5)
    return described


def run_file(rel: str, args, root: Path, env: dict, out: Path, deselect_keys: list) -> tuple[list[dict], list[str]]:
    """Run one test file until every selected test has an outcome; return the
    ``done``/``item``/``collect_error`` events and the leftover processes found."""
    results = out / (rel.replace("/", "_") + ".jsonl")
    results.unlink(missing_ok=True)
    log = open(out / (rel.replace("/", "_") + ".log"), "w")
    found_leftovers: list[str] = []
    crashed: list[dict] = []
    while True:
        events = read_events(results)
        done = {e["nodeid"] for e in events if e["event"] == "done"} | {e["nodeid"] for e in crashed}
        deselect = root / "deselect.json"
        deselect.write_text(json.dumps({"nodeids": sorted(done), "keys": deselect_keys}))
        cmd = [sys.executable, "-m", "pytest", "-p", "monarch_compat_plugin", "-p", "no:cacheprovider",
               "-c", str(root / "pytest.ini"), "--rootdir", str(root), "-q", "-rN", f"python/tests/{rel}"]
        if args.k:
            cmd += ["-k", args.k]
        proc = subprocess.Popen(cmd, cwd=root, env={**env, "MONARCH_COMPAT_RESULTS": str(results),
                                                    "MONARCH_COMPAT_DESELECT": str(deselect)},
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        hung = False
        while proc.poll() is None:
            time.sleep(2)
            running = _running(read_events(results), done)
            if running and time.time() - running["time"] > args.timeout + HANG_GRACE_S:
                os.killpg(proc.pid, signal.SIGKILL)
                hung = True
                proc.wait()
        found_leftovers += kill_leftovers(env["MONARCH_COMPAT_RUN"])
        running = _running(read_events(results), done)
        if running is None:
            break
        why = "harness: no progress, killed" if hung else f"pytest process exited with {proc.returncode}"
        crashed.append({"event": "done", "nodeid": running["nodeid"], "outcome": "crashed", "message": why,
                        "seconds": time.time() - running["time"]})
    log.close()
    return [e for e in read_events(results) if e["event"] != "start"] + crashed, found_leftovers


def _running(events: list[dict], done: set[str]) -> dict | None:
    """The test that started and has no outcome yet, if any."""
    finished = done | {e["nodeid"] for e in events if e["event"] == "done"}
    started = [e for e in events if e["event"] == "start" and e["nodeid"] not in finished]
    return started[-1] if started else None


def collect(rel: str, events: list[dict], verdicts: dict, deselected: set) -> list[dict]:
    """One record per test: every collected item, plus each test the classifier found
    but pytest did not collect (a collection error fails them all)."""
    items = {e["nodeid"]: e["key"] for e in events if e["event"] == "item"}
    done = {e["nodeid"]: e for e in events if e["event"] == "done"}
    collect_errors = [e["message"] for e in events if e["event"] == "collect_error"]
    tests, seen_keys = [], set()
    for nodeid, (_, cls, fn) in items.items():
        verdict = verdicts.get((cls, fn))
        seen_keys.add((cls, fn))
        result = done.get(nodeid, {"outcome": "not run", "message": ""})
        tests.append(_record(rel, nodeid, verdict, result))
    for (cls, fn), verdict in verdicts.items():
        if (cls, fn) in seen_keys or (cls, fn) in deselected:
            continue
        nodeid = "::".join(filter(None, [f"python/tests/{rel}", cls, fn]))
        message = f"collection error: {collect_errors[0]}" if collect_errors else "not collected"
        tests.append(_record(rel, nodeid, verdict, {"outcome": "not collected", "message": message}))
    return tests


def _record(rel: str, nodeid: str, verdict, result: dict) -> dict:
    outcome, message = result["outcome"], result.get("message", "")
    if outcome == "failed" and message.startswith("Failed: Timeout"):
        outcome = "timeout"
    return {"file": rel, "nodeid": nodeid, "public": bool(verdict and verdict.public),
            "reasons": verdict.reasons if verdict else ["unknown: not found by the classifier"],
            "outcome": outcome, "message": message, "remote": result.get("remote", ""), "seconds": round(result.get("seconds", 0.0), 2)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--monarch", type=Path, required=True, help="Monarch checkout or git dir")
    parser.add_argument("--files", nargs="+", default=FILES, help="test files, relative to python/tests")
    parser.add_argument("-k", help="pytest -k expression")
    parser.add_argument("--only", choices=["all", "public"], default="all",
                        help="'public': run only the public-API tests (internals are still counted)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per test (caps Monarch's own)")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "monarch_compat",
                        help="folder for summary.json, summary.txt and the pytest logs")
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:12]
    with tempfile.TemporaryDirectory(prefix="monarch_compat-") as tmp:
        root = Path(tmp)
        commit = extract(args.monarch.resolve(), root)
        prepare_site(root / "site")
        (root / "pytest.ini").write_text(PYTEST_INI)
        api = PublicApi.read(root / "python")
        tests_dir = root / "python" / "tests"
        env = {**os.environ, "MONARCH_COMPAT_RUN": run_id, "MONARCH_COMPAT_TIMEOUT": str(args.timeout),
               "MONARCH_NB_HOME": str(root / "monarch_nb_home"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "site"), str(tests_dir),
                                                           os.environ.get("PYTHONPATH", "")]))}
        tests, leftover = [], {}
        for rel in args.files:
            verdicts = classify_file(tests_dir / rel, api)
            deselected = {k for k, v in verdicts.items() if args.only == "public" and not v.public}
            started = time.time()
            events, left = run_file(rel, args, root, env, args.out, [[f"python/tests/{rel}", *k] for k in deselected])
            file_tests = collect(rel, events, verdicts, deselected)
            tests += file_tests
            if left:
                leftover[rel] = left
            passed = sum(t["outcome"] == "passed" for t in file_tests)
            print(f"{rel}: {passed}/{len(file_tests)} passed, {len(left)} leftover processes "
                  f"({time.time() - started:.0f} s)", flush=True)

    summary = summarize(tests)
    summary.update({"monarch_commit": commit, "files_run": args.files, "k": args.k, "only": args.only,
                    "timeout_s": args.timeout, "leftover_processes": leftover, "results": tests})
    header = [f"Monarch {commit} tests on monarch_nb (timeout {args.timeout:.0f} s per test"
              + (f", -k {args.k!r}" if args.k else "") + ")",
              f"leftover processes after the tests: {sum(map(len, leftover.values()))}"
              + "".join(f"\n  {rel}: {p}" for rel, ps in leftover.items() for p in ps)]
    text = as_text(summary, header)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (args.out / "summary.txt").write_text(text)
    print(text + f"written to {args.out}/summary.json and summary.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
