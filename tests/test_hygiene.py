"""Process hygiene: an ephemeral cluster's processes all end with the script that made
it, however the script ends, and with its hub. Code hygiene: the wire vocabulary is
spelled only in ``monarch_nb.protocol``."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

import monarch_nb
from monarch_nb.protocol import envelope, hub_ops
from monarch_nb.protocol.states import Activity, DiscoveryState, FailureKind, HealthState

from conftest import cluster_processes, pids_alive, wait_until

SCRIPT = textwrap.dedent("""
    import json, sys, time
    from monarch_nb.actor import Actor, endpoint, this_host
    from monarch_nb.client import cluster as cluster_mod
    from monarch_nb.client.runtime import runtime

    class Echo(Actor):
        @endpoint
        def echo(self, x):
            return x

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("echo", Echo)
    assert mesh.echo.call("hi").get().values() == ["hi", "hi"]
    c = runtime().cluster
    print(json.dumps({"path": str(c.path), "hub": c._hub_process.pid, "procs": procs.pids}), flush=True)
    mode = sys.argv[1]
    if mode == "raise":
        raise RuntimeError("script failed")
    if mode == "wait":
        print("waiting", flush=True)
        time.sleep(600)
""")


def _start(mode: str):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    info = json.loads(proc.stdout.readline())
    return proc, info


def _assert_all_gone(info):
    pids = [info["hub"], *info["procs"]]
    assert wait_until(lambda: not pids_alive(pids) and not cluster_processes(info["path"]), 10), (
        f"left behind: {cluster_processes(info['path'])}")
    assert wait_until(lambda: not os.path.exists(info["path"]), 5)


@pytest.mark.parametrize("mode", ["exit", "raise"])
def test_cluster_ends_when_script_ends(mode):
    proc, info = _start(mode)
    proc.communicate(timeout=60)
    assert proc.returncode == (0 if mode == "exit" else 1)
    _assert_all_gone(info)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_cluster_ends_when_script_is_signalled(sig):
    proc, info = _start("wait")
    assert proc.stdout.readline().strip() == "waiting"
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    _assert_all_gone(info)


def test_host_agent_and_procs_stop_after_grace_when_hub_is_killed():
    proc, info = _start("wait")
    assert proc.stdout.readline().strip() == "waiting"
    agents = [p.pid for p in psutil.Process(info["hub"]).children()]
    os.kill(info["hub"], signal.SIGKILL)
    # Ephemeral clusters give host agents a 2 s grace period before they stop everything.
    assert wait_until(lambda: not pids_alive(agents + info["procs"]), 10)
    proc.kill()
    proc.communicate(timeout=30)
    # Its directory is left (the hub was killed); listing clusters tidies it away.
    assert os.path.isdir(info["path"])
    assert info["path"] not in [c["path"] for c in monarch_nb.list_clusters()]
    assert not os.path.exists(info["path"])


# -- the wire vocabulary lives in monarch_nb.protocol ------------------------------------

PACKAGE = pathlib.Path(monarch_nb.__file__).parent
HEADER_NAMES = {envelope.OP, envelope.KIND}  # "op", "k": the names of a message
HUB_OPS = {v for k, v in vars(hub_ops).items() if k.isupper() and isinstance(v, str)}


def _is_str(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _names_header(node) -> bool:
    """``X[envelope.OP]``, ``X.get(envelope.KIND)``: reads what a message asks for."""
    if isinstance(node, ast.Subscript):
        key = node.slice
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        key = node.args[0]
    else:
        return False
    return isinstance(key, ast.Attribute) and key.attr in ("OP", "KIND")


def _wire_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module spells wire vocabulary as a bare string."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if _is_str(key) and key.value in HEADER_NAMES:
                    found.append((node.lineno, f"header key {key.value!r}"))
                elif isinstance(key, ast.Attribute) and key.attr in ("OP", "KIND") and _is_str(value):
                    found.append((node.lineno, f"op/kind {value.value!r}"))
        elif isinstance(node, ast.Subscript) and _is_str(node.slice) and node.slice.value in HEADER_NAMES:
            found.append((node.lineno, f"header[{node.slice.value!r}]"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
              and _is_str(node.args[0])):
            name = node.args[0].value
            if node.func.attr == "get" and name in HEADER_NAMES:
                found.append((node.lineno, f"get({name!r})"))
            elif node.func.attr == "request" and name in HUB_OPS:
                found.append((node.lineno, f"request({name!r})"))
        elif isinstance(node, ast.Compare) and any(map(_names_header, [node.left, *node.comparators])):
            for side in [node.left, *node.comparators]:
                strings = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                found += [(node.lineno, f"compared with {s.value!r}") for s in strings if _is_str(s)]
    return found


# States and kinds (protocol.states): health states, actor activities, discovery states,
# failure kinds. Their words are common English ("running", "stopped" of a debugger
# event), so a string is flagged only where it stands for a state: compared with a
# state (``x["state"]``, ``x.get("state")``, ``x.state``, ``x.kind``, a name ending in
# ``state``), as the value of a ``"state"``/``"kind"`` key or argument, assigned to a
# name ending in ``state``, among two or more such words in one tuple, list or set, or
# three or more keys of one table.
STATE_WORDS = {m.value for e in (HealthState, Activity, DiscoveryState, FailureKind) for m in e}
STATE_KEYS = {"state", "kind", "STATE"}


def _state_word(node) -> bool:
    return _is_str(node) and node.value in STATE_WORDS


def _names_state(node) -> bool:
    """``x["state"]``, ``x[STATE]``, ``x.get("state")``, ``x.state``, ``x.kind``, ``state``."""
    if isinstance(node, ast.Subscript):
        key = node.slice
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        key = node.args[0]
    elif isinstance(node, ast.Attribute):
        return node.attr in ("state", "kind")
    elif isinstance(node, ast.Name):
        return node.id.endswith("state")
    else:
        return False
    return (_is_str(key) and key.value in STATE_KEYS) or (isinstance(key, (ast.Name, ast.Attribute))
                                                          and getattr(key, "id", getattr(key, "attr", "")) == "STATE")


def _state_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module spells a state or failure kind as a bare string."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(map(_names_state, [node.left, *node.comparators])):
            for side in [node.left, *node.comparators]:
                words = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                found += [(node.lineno, f"compared with {w.value!r}") for w in words if _state_word(w)]
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if _is_str(key) and key.value in STATE_KEYS and _state_word(value):
                    found.append((node.lineno, f"{key.value!r}: {value.value!r}"))
            if sum(map(_state_word, node.keys)) >= 3:
                found.append((node.lineno, "a table keyed by state words"))
        elif isinstance(node, ast.keyword) and node.arg in STATE_KEYS and _state_word(node.value):
            found.append((node.value.lineno, f"{node.arg}={node.value.value!r}"))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                values = (node.value.elts if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                          else [node.value] * len(names))
                found += [(node.lineno, f"{ast.unparse(n)} = {v.value!r}") for n, v in zip(names, values)
                          if _names_state(n) and _state_word(v)]
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and sum(map(_state_word, node.elts)) >= 2:
            found.append((node.lineno, f"states {[e.value for e in node.elts if _state_word(e)]}"))
        elif isinstance(node, ast.Call) and node.args and any(map(_state_word, node.args)) and (
                isinstance(node.func, ast.Name) and node.func.id in ("Probe",)):
            found.append((node.lineno, f"{node.func.id}(... {[a.value for a in node.args if _state_word(a)]})"))
    return found


def test_states_and_failure_kinds_are_spelled_only_in_protocol():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "protocol":
            continue
        found += [f"{path.relative_to(PACKAGE)}:{line}: {what}"
                  for line, what in _state_strings(ast.parse(path.read_text(), str(path)))]
    assert not found, "use the enums of monarch_nb.protocol.states:\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    'if proc["state"] == "busy": pass',
    'if node.get("state") in ("failed", "lost"): pass',
    'node = {"state": "healthy"}',
    'state, cause = "lost", "gone"',
    'COLOURS = {"healthy": 1, "busy": 2, "failed": 3}',
    'if failure.kind == "endpoint_failed": pass',
    'if found.state != "running": pass',
    'Node(key, "host", state="paused")',
])
def test_the_state_check_finds_a_bare_state(source):
    assert _state_strings(ast.parse(source))


@pytest.mark.parametrize("source", [
    'if event == "stopped": pass',  # a debugger (DAP) event, not a state
    'reply = {"stopped": False, "running": True}',
    'text = "0 failed"',
    'if proc[STATE] == HealthState.BUSY: pass',
])
def test_the_state_check_leaves_other_words_alone(source):
    assert not _state_strings(ast.parse(source))


def test_a_proc_importing_the_test_helpers_keeps_the_runs_home_and_makes_no_folder(tmp_path):
    home, tmp = tmp_path / "monarch-nb-test-run", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    done = subprocess.run([sys.executable, "-c", "import os, conftest; print(os.environ['MONARCH_NB_HOME'])"],
                          cwd=pathlib.Path(__file__).parent, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MONARCH_NB_HOME": str(home), "TMPDIR": str(tmp)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(home)
    assert not list(tmp.iterdir())


@pytest.mark.parametrize("required", [False, True])
def test_a_missing_system_part_skips_saying_why_unless_required(tmp_path, required):
    (tmp_path / "test_part.py").write_text(
        "from conftest import system_part_missing\n\n"
        "def test_needs_a_widget():\n    system_part_missing('no widget daemon here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pathlib.Path(__file__).parent),
                                                        os.environ.get("PYTHONPATH", "")])}
    env.pop("MONARCH_NB_REQUIRE_SYSTEM", None)
    if required:
        env["MONARCH_NB_REQUIRE_SYSTEM"] = "1"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "test_part.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert "no widget daemon here" in done.stdout
    assert ("1 failed" if required else "1 skipped") in done.stdout, done.stdout


def test_wire_vocabulary_is_spelled_only_in_protocol():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "protocol":
            continue
        found += [f"{path.relative_to(PACKAGE)}:{line}: {what}"
                  for line, what in _wire_strings(ast.parse(path.read_text(), str(path)))]
    assert not found, "use the names of monarch_nb.protocol:\n" + "\n".join(found)


def test_protocol_imports_nothing_of_monarch_nb():
    for path in (PACKAGE / "protocol").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                assert node.level <= 1 and not (node.module or "").startswith("monarch_nb"), (
                    f"{path.name} imports {node.module}")
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("monarch_nb") for a in node.names), f"{path.name} imports monarch_nb"


def test_the_notebook_extra_needs_an_ipykernel_that_parents_each_threads_output():
    # ipykernel 6.x has no per-thread stream parent: actor lines printed after their
    # cell finished went out with an empty parent header, and no frontend showed them.
    import tomllib

    from ipykernel.iostream import OutStream

    extra = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    floor = next(req for req in extra["notebook"] if req.startswith("ipykernel"))
    assert floor == "ipykernel>=7" and hasattr(OutStream, "set_thread_parent")
