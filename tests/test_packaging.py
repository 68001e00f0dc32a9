"""Installing the package is enough for Jupyter to list the ``monarch`` kernel: from a
built wheel and from an editable install, each into a fresh venv that has only
jupyter_client besides (no further command, as ipykernel's ``python3``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What a build reads: a copy keeps setuptools' build/ and egg-info out of the checkout.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "kernel", "monarch_nb")

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(600)]

# A PYTHONPATH naming a checkout would make the fresh venv see the package as installed.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True,
                   env=CLEAN_ENV)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, copy / name)
    return copy


@pytest.fixture()
def fresh_venv(tmp_path) -> Path:
    """A new venv holding jupyter_client and nothing of this environment's."""
    venv.create(tmp_path / "venv", with_pip=False)
    python = tmp_path / "venv" / "bin" / "python"
    pip("--python", str(python), "install", "jupyter_client")
    return tmp_path / "venv"


def kernelspecs(env: Path) -> dict:
    out = subprocess.run([str(env / "bin" / "jupyter"), "kernelspec", "list", "--json"], check=True,
                         capture_output=True, text=True, env=CLEAN_ENV).stdout
    return json.loads(out)["kernelspecs"]


def assert_monarch_kernel_listed(env: Path) -> None:
    spec = kernelspecs(env).get("monarch")
    assert spec is not None, kernelspecs(env)
    assert Path(spec["resource_dir"]).resolve().is_relative_to(env.resolve())
    assert spec["spec"]["display_name"] == "Monarch (Python 3)"
    assert spec["spec"]["interrupt_mode"] == "signal"
    assert {"logo-32x32.png", "logo-64x64.png", "logo-svg.svg"} <= {p.name for p in Path(spec["resource_dir"]).iterdir()}


def test_a_wheel_install_lists_the_monarch_kernel(source, fresh_venv, tmp_path):
    pip("wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(source))
    (wheel,) = (tmp_path / "dist").glob("monarch_nb-*.whl")
    pip("--python", str(fresh_venv / "bin" / "python"), "install", "--no-deps", str(wheel))
    assert_monarch_kernel_listed(fresh_venv)


def test_an_editable_install_lists_the_monarch_kernel(source, fresh_venv):
    pip("--python", str(fresh_venv / "bin" / "python"), "install", "--no-deps", "-e", str(source))
    assert_monarch_kernel_listed(fresh_venv)
