"""Sort Monarch's tests into "public API" and "internals" by reading their source.

A test is *internals* when the code it runs names something of Monarch's that a user of
its public API can't reach: ``monarch._rust_bindings``, a ``monarch._src`` name that no
public package re-exports, ``monarch.config``, the tensor engine, RDMA, or any other
``monarch.*`` module outside the public packages. The code a test runs is its own body
and decorators, the fixtures it asks for (and autouse ones), and, transitively, the
module-level functions and classes it names, also those it imports from Monarch's test
helper modules beside it (``rdma_test_utils.rdma_backends``); names are traced through
imports and module-level aliases, and ``"monarch...."`` strings (``mock.patch`` targets)
count. What the helpers name to carry the runtime config into a subprocess
(``isolate_in_subprocess``) is test infrastructure, not a reason (see shim.py).
Type-only uses (annotations, ``cast``'s type) don't count: they run nothing.

The public packages and what they re-export are read from the Monarch source under
test (their ``__init__.py``), so the split follows the Monarch version being run.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

PUBLIC_PACKAGES = ("monarch.actor", "monarch.job", "monarch.spmd", "monarch.rdma")

# Re-exported by monarch.actor, yet a runtime knob rather than actor API (see issue #14).
CONFIG = ("monarch.config", "monarch._src.actor.config", "monarch.actor.config")
TENSOR_ENGINE = ("monarch.tensor_engine", "monarch.mesh_controller", "monarch._testing", "monarch.common",
                 "monarch.fetch", "monarch.worker", "monarch.controller", "monarch.builtins",
                 "monarch.simulator", "monarch._src.tensor_engine", "monarch.gradient", "monarch.opaque_")
# Names only _rust_bindings defines, yet the public API raises them at its users, who
# must name them to catch them: SupervisionError is what a call on a dead actor raises.
RAISED_AT_USERS = {"monarch._rust_bindings.monarch_hyperactor.supervision.SupervisionError"}
# Attributes of Monarch's objects that hold its Rust (hyperactor) handles, such as
# HostMesh._hy_host_mesh: objects of monarch._rust_bindings, whatever name reached them.
RUST_HANDLE_PREFIX = "_hy_"
# importlib.resources.files("monarch.python.tests"): binaries that Monarch's Buck build makes.
BUCK_TEST_BINARIES = "monarch.python.tests"
# What isolate_in_subprocess uses to copy the runtime config into its subprocess (shim.py
# answers them): harness plumbing when a helper module names them, not the test's API.
# Likewise what rdma_test_utils uses to run a test once per RDMA backend (shim.py runs
# the no-ibverbs case, monarch_nb's only backend, and asks monarch.rdma about ibverbs).
HELPER_INFRASTRUCTURE = {"monarch.config.get_runtime_config", "monarch.config.configure",
                         "monarch.config.get_global_config", "monarch.config.parametrize_config_pointwise"}


@dataclass
class PublicApi:
    """What the public packages export: ``names[package]`` and the dotted origins of
    re-exported objects (``monarch._src.actor.actor_mesh.Actor``)."""

    names: dict[str, set[str]] = field(default_factory=dict)
    origins: set[str] = field(default_factory=set)

    @classmethod
    def read(cls, monarch_python: Path) -> "PublicApi":
        """From ``monarch_python`` = the ``python/`` folder of a Monarch source tree."""
        api = cls()
        for package in PUBLIC_PACKAGES:
            init = monarch_python.joinpath(*package.split("."), "__init__.py")
            names = api.names.setdefault(package, set())
            if not init.exists():
                continue
            for node in ast.parse(init.read_text()).body:
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    for alias in node.names:
                        names.add(alias.asname or alias.name)
                        api.origins.add(f"{node.module}.{alias.name}")
                elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    names.add(node.name)
        return api

    def category(self, dotted: str) -> str | None:
        """None when ``dotted`` (a ``monarch...`` name) is public API, else why not."""
        if _under(dotted, (BUCK_TEST_BINARIES,)):
            return "Buck-built test binary"
        if any(_under(dotted, (name,)) for name in RAISED_AT_USERS):
            return None
        if _under(dotted, CONFIG):
            return "monarch.config"
        for package in PUBLIC_PACKAGES:
            if dotted == package:
                return None
            if dotted.startswith(package + "."):
                head = dotted[len(package) + 1:].split(".")[0]
                return None if head in self.names.get(package, ()) else f"not exported by {package}"
        parts = dotted.split(".")
        if any(".".join(parts[:i]) in self.origins for i in range(2, len(parts) + 1)):
            return None
        if any("rdma" in p for p in parts):
            return "rdma"
        if any(dotted.startswith(p) for p in TENSOR_ENGINE):
            return "tensor engine"
        if dotted.startswith("monarch._rust_bindings"):
            return "monarch._rust_bindings"
        if dotted.startswith("monarch._src"):
            return "monarch._src (not re-exported)"
        return "other monarch module" if dotted != "monarch" else None


def _under(dotted: str, prefixes: tuple[str, ...]) -> bool:
    return any(dotted == p or dotted.startswith(p + ".") for p in prefixes)


def _import_aliases(nodes) -> dict[str, str]:
    aliases = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _is_fixture(fn: ast.AST) -> tuple[bool, bool]:
    """(is a pytest fixture, autouse)."""
    for d in getattr(fn, "decorator_list", []):
        call = d if isinstance(d, ast.Call) else None
        target = ast.unparse(call.func if call else d)
        if target.endswith("fixture"):
            autouse = bool(call) and any(k.arg == "autouse" and ast.unparse(k.value) == "True" for k in call.keywords)
            return True, autouse
    return False, False


class TestModule:
    """One test file: its aliases, module-level definitions and fixtures."""

    def __init__(self, source: str, helpers: Path | None = None):
        """``helpers``: the folder of Monarch's tests, where the modules a test file
        imports helpers from (``rdma_test_utils.py``) are read."""
        tree = ast.parse(source)
        self.helpers = helpers
        self._helper_modules: dict[str, TestModule | None] = {}
        self.aliases = _import_aliases(ast.walk(tree))
        self.defs: dict[str, ast.AST] = {}
        self.fixtures: dict[str, ast.AST] = {}
        self.autouse: list[str] = []
        self.classes: dict[str, ast.ClassDef] = {}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs[node.name] = node
                fixture, autouse = _is_fixture(node)
                if fixture:
                    self.fixtures[node.name] = node
                    if autouse:
                        self.autouse.append(node.name)
                if isinstance(node, ast.ClassDef):
                    self.classes[node.name] = node
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                dotted = self._dotted(node.value)
                if dotted and dotted.split(".")[0] == "monarch":
                    self.aliases[node.targets[0].id] = dotted

    def _dotted(self, node: ast.AST) -> str | None:
        """``a.b.c`` for a Name/Attribute chain whose head is an imported name."""
        attrs = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.aliases:
            return ".".join([self.aliases[node.id], *reversed(attrs)])
        return None

    def references(self, test: ast.AST, cls: ast.ClassDef | None) -> set[str]:
        """Every ``monarch...`` name the test's code uses (see module docstring)."""
        found: set[str] = set()
        seen: set[int] = set()
        todo = [test, *(self.fixtures[n] for n in self.autouse)]
        if cls is not None:  # its setUp, helpers and class-level fixtures
            todo += [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and not n.name.startswith("test")]
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in node.args.args + node.args.kwonlyargs:
                    if arg.arg in self.fixtures:
                        todo.append(self.fixtures[arg.arg])
            for name in self._walk(node, found):
                if name in self.defs:
                    todo.append(self.defs[name])
        return found

    def _helper_references(self, dotted: str) -> set[str]:
        """The monarch names that ``helper_module.NAME`` runs, for a helper module of
        Monarch's tests folder (none for anything else)."""
        module_name, _, name = dotted.partition(".")
        name = name.split(".")[0]
        if self.helpers is None or not name:
            return set()
        if module_name not in self._helper_modules:
            path = self.helpers / f"{module_name}.py"
            self._helper_modules[module_name] = TestModule(path.read_text(), self.helpers) if path.is_file() else None
        helper = self._helper_modules[module_name]
        if helper is None or name not in helper.defs:
            return set()
        self._helper_modules[module_name] = None  # a helper naming itself again ends here
        try:
            return helper.references(helper.defs[name], None) - HELPER_INFRASTRUCTURE
        finally:
            self._helper_modules[module_name] = helper

    def _walk(self, root: ast.AST, found: set[str]):
        """Collect dotted monarch names into ``found``; yield local names used."""
        stack = [root]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Attribute) and node.attr.startswith(RUST_HANDLE_PREFIX):
                found.add(f"monarch._rust_bindings (a {node.attr} handle)")
            if isinstance(node, (ast.Attribute, ast.Name)):
                dotted = self._dotted(node)
                if dotted:
                    if dotted.split(".")[0] == "monarch":
                        found.add(dotted)
                    elif dotted == "importlib.resources.files":  # how the tests find Buck's binaries
                        found.add(BUCK_TEST_BINARIES)
                    else:
                        found.update(self._helper_references(dotted))
                    continue
                if isinstance(node, ast.Name):
                    yield node.id
                    continue
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "monarch":
                found.update(f"{node.module}.{a.name}" for a in node.names)
                continue
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.split(".")[0] == "monarch")
                continue
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("monarch."):
                found.add(node.value.split("(")[0].strip())
                continue
            stack.extend(_runtime_children(node))


def _runtime_children(node: ast.AST) -> list[ast.AST]:
    """Children that run: not annotations, nor the type argument of ``cast``/``assert_type``."""
    if isinstance(node, ast.arg):
        return []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        return [*node.decorator_list, *node.body, *args.defaults, *(d for d in args.kw_defaults if d)]
    if isinstance(node, ast.AnnAssign):
        return [c for c in (node.target, node.value) if c is not None]
    if isinstance(node, ast.Call):
        func = ast.unparse(node.func)
        if func.endswith("cast") and node.args:
            return [node.func, *node.args[1:], *node.keywords]
        if func.endswith("assert_type") and node.args:
            return [node.func, node.args[0]]
    return list(ast.iter_child_nodes(node))


@dataclass
class Verdict:
    public: bool
    reasons: list[str]  # "category: dotted name", for internals


def classify_file(path: Path, api: PublicApi) -> dict[tuple[str | None, str], Verdict]:
    """``(class name or None, function name)`` -> verdict, for each test in the file
    (pytest's default discovery: ``test*`` functions, ``test*`` methods of ``Test*`` or
    ``TestCase`` classes)."""
    tests_dir = next((p for p in path.parents if p.name == "tests"), path.parent)
    module = TestModule(path.read_text(), tests_dir)
    tests: list[tuple[str | None, ast.AST, ast.ClassDef | None]] = []
    for name, node in module.defs.items():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and name.startswith("test"):
            tests.append((None, node, None))
        elif isinstance(node, ast.ClassDef) and (name.startswith("Test") or any(
                ast.unparse(b).endswith("TestCase") for b in node.bases)):
            tests += [(name, m, node) for m in node.body
                      if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test")]
    verdicts = {}
    for cls_name, fn, cls in tests:
        reasons = sorted(f"{cat}: {ref}" for ref in module.references(fn, cls) if (cat := api.category(ref)))
        verdicts[(cls_name, fn.name)] = Verdict(not reasons, reasons)
    return verdicts
