"""Make ``import monarch...`` resolve to monarch_nb, for running Monarch's own tests.

``install()`` puts a finder first on ``sys.meta_path`` that answers every ``monarch``
and ``monarch.*`` import with a stand-in module. Reading a name from a stand-in
module ``monarch.P`` gives, in order:

1. the same name from ``monarch_nb.P`` when P is a public path (no ``_`` component)
   and that module exists (``monarch.actor`` -> ``monarch_nb.actor``,
   ``monarch.spmd`` -> ``monarch_nb.spmd``);
2. for a private module ``monarch._src.X...``, the same name from ``monarch_nb.X``
   (``monarch._src.job.process.ProcessJob`` -> ``monarch_nb.job.ProcessJob``);
3. the same public name from ``monarch_nb.actor``, then from ``monarch_nb``
   (``monarch._src.actor.host_mesh.this_host`` -> ``monarch_nb.actor.this_host``);
4. otherwise a placeholder that raises ``NotImplementedError("monarch_nb has no
   <dotted name>")`` when called, instantiated, subclassed-then-instantiated, iterated
   or entered. Subscripting it (``Port[int]``) and decorating with it at module level
   (``@missing``, ``@missing(option=...)``: a deferred placeholder) don't raise, so a test module always imports and only the tests that really use a
   missing thing fail.

Functions of ours are wrapped so that a call whose arguments don't fit our signature
(``@endpoint(explicit_response_port=True)``) gives a deferred placeholder rather than a
``TypeError`` at import time. Assigning a name on a stand-in module
(``monarch.actor.unhandled_fault_hook = hook``, ``mock.patch(...)``) also assigns it on
the monarch_nb module the name came from, as it would in Monarch.

The harness loads this file from a ``sitecustomize.py`` on ``PYTHONPATH``, so the
client, the procs monarch_nb starts and the subprocesses tests start all see it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import sys
import types

ROOT = "monarch"

# Test infrastructure rather than API: Monarch's isolate_in_subprocess copies the
# runtime config into its subprocess through these two, so every isolated test would
# fail on them, whatever it tests. A configure() that sets something still fails.
_INFRASTRUCTURE = {
    "monarch.config.get_runtime_config": lambda: {},
}


def _configure_nothing(**settings):
    if settings:
        raise NotImplementedError(f"monarch_nb has no monarch.config.configure ({', '.join(settings)})")


_INFRASTRUCTURE["monarch.config.configure"] = _configure_nothing

# Monarch's RDMA tests run once per backend through these config keys. monarch_nb has
# one backend, no ibverbs (same host: process_vm_readv/writev; across hosts: TCP), so
# "no ibverbs" is what it always does; the ibverbs cases ask monarch.rdma whether
# ibverbs is there, and monarch_nb's answer (or its lack of one) decides them.
_RDMA_BACKEND_KEYS = {"rdma_disable_ibverbs", "rdma_allow_tcp_fallback"}
_config: dict = {}


@contextlib.contextmanager
def _configured(**settings):
    unknown = sorted(set(settings) - _RDMA_BACKEND_KEYS)
    if unknown:
        raise NotImplementedError(f"monarch_nb has no monarch.config.configured ({', '.join(unknown)})")
    saved = dict(_config)
    _config.update(settings)
    try:
        yield dict(_config)
    finally:
        _config.clear()
        _config.update(saved)


def _parametrize_config_pointwise(**options):
    """Monarch's pytest helper: run the test once per index of the (equally long) value
    lists, under ``configured(key=value, ...)`` for that index."""
    import pytest

    keys = list(options)
    cases = list(zip(*(options[k] for k in keys)))

    def decorate(fn):
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def run(*args, _monarch_config, **kwargs):
                with _configured(**_monarch_config):
                    return await fn(*args, **kwargs)
        else:
            @functools.wraps(fn)
            def run(*args, _monarch_config, **kwargs):
                with _configured(**_monarch_config):
                    return fn(*args, **kwargs)
        run.__signature__ = inspect.signature(fn).replace(parameters=[  # type: ignore[attr-defined]
            *inspect.signature(fn).parameters.values(),
            inspect.Parameter("_monarch_config", inspect.Parameter.KEYWORD_ONLY)])
        ids = ["-".join(f"{k}={v}" for k, v in zip(keys, case)) for case in cases]
        return pytest.mark.parametrize("_monarch_config", [dict(zip(keys, case)) for case in cases], ids=ids)(run)

    return decorate


_INFRASTRUCTURE["monarch.config.configured"] = _configured
_INFRASTRUCTURE["monarch.config.get_global_config"] = lambda: dict(_config)
_INFRASTRUCTURE["monarch.config.parametrize_config_pointwise"] = _parametrize_config_pointwise


def missing_message(dotted: str) -> str:
    return f"monarch_nb has no {dotted}"


class _Missing(type):
    """Metaclass of placeholders: classes named for what monarch_nb lacks."""

    def __call__(cls, *args, **kwargs):
        decorating = len(args) == 1 and not kwargs and (inspect.isfunction(args[0]) or inspect.isclass(args[0]))
        if decorating or (kwargs and not args):  # @missing or @missing(option=...) at import time
            return Deferred(f"{cls._dotted}(...) used as a decorator", missing_message(cls._dotted))
        raise NotImplementedError(cls._message)

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return placeholder(f"{cls._dotted}.{name}")

    def __getitem__(cls, _params):
        return cls  # annotations such as Port[int] evaluated at import time

    def __iter__(cls):
        raise NotImplementedError(cls._message)

    def __len__(cls):
        raise NotImplementedError(cls._message)

    def __enter__(cls):
        raise NotImplementedError(cls._message)

    def __aenter__(cls):
        raise NotImplementedError(cls._message)

    def __await__(cls):
        raise NotImplementedError(cls._message)


_placeholders: dict[str, type] = {}


def placeholder(dotted: str) -> type:
    """The placeholder for Monarch's ``dotted`` name (one per name, so ``is`` holds).

    It derives from ``Exception`` so ``except``/``pytest.raises`` accept it; a class
    deriving from it raises on instantiation, naming the missing base."""
    if dotted not in _placeholders:
        _placeholders[dotted] = _Missing(dotted.rsplit(".", 1)[-1], (Exception,), {
            "_dotted": dotted, "_message": missing_message(dotted), "__module__": dotted.rsplit(".", 1)[0]})
    return _placeholders[dotted]


class Deferred:
    """What a decorator or call that monarch_nb can't honour returns: it raises
    ``NotImplementedError(message)`` when called or when any attribute is read."""

    def __init__(self, what: str, message: str):
        object.__setattr__(self, "_what", what)
        object.__setattr__(self, "_message", message)

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and inspect.isfunction(args[0]):
            return self  # a decorator factory's result applied to the function
        raise NotImplementedError(self._message)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        raise NotImplementedError(self._message)

    def __repr__(self):
        return f"<unsupported {self._what}>"


_wrapped: dict[int, types.FunctionType] = {}


def _checked(fn, dotted: str):
    """``fn`` (one of ours) behind a signature check: arguments that don't bind give a
    :class:`Deferred` naming them instead of a ``TypeError`` (see module docstring)."""
    if id(fn) in _wrapped:
        return _wrapped[id(fn)]
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            signature.bind(*args, **kwargs)
        except TypeError as e:
            return Deferred(f"{dotted}(...)", f"monarch_nb's {fn.__module__}.{fn.__qualname__} does not take the "
                                              f"arguments of {dotted}: {e}")
        return fn(*args, **kwargs)

    _wrapped[id(fn)] = call
    return call


_PUBLIC_SRC = (["actor"], ["job"], ["spmd"], ["rdma"])  # monarch._src.X whose public face is monarch.X


def _sources(dotted_module: str) -> list[str]:
    """monarch_nb modules that may hold the names of Monarch's ``dotted_module``."""
    parts = dotted_module.split(".")[1:]
    same = ["monarch_nb." + ".".join(parts)] if parts and not any(p.startswith("_") for p in parts) else []
    # monarch._src.job.process -> monarch_nb.job: a private module of a public package
    package = ["monarch_nb." + parts[1]] if parts[:1] == ["_src"] and parts[1:2] in _PUBLIC_SRC else []
    return same + package + ["monarch_nb.actor", "monarch_nb"]


def _import(name: str):
    try:
        if importlib.util.find_spec(name) is None:
            return None
    except ImportError:  # a parent is not a package
        return None
    return importlib.import_module(name)


def resolve(dotted_module: str, name: str):
    """(value, source module) for ``dotted_module.name``; source is None for a placeholder."""
    dotted = f"{dotted_module}.{name}"
    if dotted in _INFRASTRUCTURE:
        return _INFRASTRUCTURE[dotted], None
    if not name.startswith("_"):
        for source in _sources(dotted_module):
            module = _import(source)
            if module is None:
                continue
            try:
                value = getattr(module, name)
            except AttributeError:
                continue
            if isinstance(value, types.ModuleType):
                continue
            return (_checked(value, dotted) if inspect.isfunction(value) else value), module
    return placeholder(dotted), None


class StandIn(types.ModuleType):
    """A Monarch module; names resolve on each read (see :func:`resolve`)."""

    def __reduce__(self):
        # cloudpickle sends a test function's globals (``monarch``) to subprocesses by
        # name; every process of a run has the shim, so the import gives a stand-in there
        return importlib.import_module, (self.__name__,)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return resolve(self.__name__, name)[0]

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name.startswith("__") or isinstance(value, types.ModuleType):
            return
        _, source = resolve(self.__name__, name)
        if source is not None:
            setattr(source, name, value)


class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != ROOT and not fullname.startswith(ROOT + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = StandIn(spec.name)
        module.__path__ = []  # a package, so any submodule imports
        return module

    def exec_module(self, module):
        pass


def install() -> None:
    """Answer ``monarch`` imports in this process (idempotent)."""
    if not any(isinstance(f, Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, Finder())
