"""The live health tree in a real browser: JupyterLab (on loopback) driven by headless
Chromium (Debian's chromium and chromedriver, see .ci/setup.d/20-browser.sh) runs a
notebook that displays its cluster; a proc killed from outside turns failed in the
page. A screenshot is kept in .ci/artifacts/health_widget.png."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import psutil
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from monarch_nb.kernelspec import write_data_dir
from monarch_nb.proc.torch_env import free_port

from conftest import pids_alive, system_part_missing, wait_until

ARTIFACTS = Path(__file__).resolve().parents[1] / ".ci" / "artifacts"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")

NOTEBOOK_CELLS = [
    """\
from monarch_nb.actor import Actor, endpoint, this_host
from monarch_nb.client.cluster import default_cluster

class Worker(Actor):
    @endpoint
    def ping(self) -> str:
        return "pong"

procs = this_host().spawn_procs(per_host={"gpus": 2}, name="browser")
workers = procs.spawn("workers", Worker)
cluster = default_cluster()""",
    "cluster",
]

# A node as the widget shows it (not the text/html fallback, which never changes).
NODE = '.jupyter-widgets [data-mnb-node="{}"]'
STATE_JS = "const n = document.querySelector(arguments[0]); return n ? n.dataset.mnbState : null;"
KERNEL_IDLE_JS = """
const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
return !!(k && k.status === 'idle' && w.context.path === 'health.ipynb');"""

def _notebook() -> dict:
    cells = [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
              "source": source} for source in NOTEBOOK_CELLS]
    return {"nbformat": 4, "nbformat_minor": 5, "cells": cells,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}


@pytest.fixture
def lab():
    """A JupyterLab server on loopback with a token, its own root and settings; yields
    (base URL, token, server process). Shut down with its kernels afterwards."""
    root = Path(tempfile.mkdtemp(prefix="monarch-nb-lab-"))
    (root / "notebooks").mkdir()
    (root / "notebooks" / "health.ipynb").write_text(json.dumps(_notebook()))
    settings = root / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    # No news or update checks (no network here, and no toast over the screenshot).
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    port, token = free_port(), secrets.token_hex(16)
    write_data_dir(root / "jupyter")
    env = {**os.environ, "JUPYTER_PATH": str(root / "jupyter"), "JUPYTER_CONFIG_DIR": str(root / "config"),
           "JUPYTER_RUNTIME_DIR": str(root / "runtime"), "JUPYTERLAB_SETTINGS_DIR": str(root / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(root / "workspaces")}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--allow-root", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--ServerApp.token={token}", f"--ServerApp.root_dir={root / 'notebooks'}",
         "--LabApp.expose_app_in_browser=True", "--ServerApp.port_retries=0"],
        env=env, stdout=subprocess.DEVNULL, stderr=(lab_log := open(root / "lab.log", "w")))
    url = f"http://127.0.0.1:{port}"

    def api(path: str, method: str = "GET"):
        request = urllib.request.Request(f"{url}{path}", method=method, headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            body = reply.read()
            return json.loads(body) if body else None

    def up() -> bool:
        try:
            return api("/api/status") is not None
        except OSError:
            return server.poll() is not None  # ends the wait; asserted below

    try:
        assert wait_until(up, 60, 0.2) and server.poll() is None, (root / "lab.log").read_text()[-3000:]
        yield url, token, server, api
    finally:
        try:
            for kernel in api("/api/kernels"):
                api(f"/api/kernels/{kernel['id']}", "DELETE")
        except OSError:
            pass
        server.send_signal(signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        lab_log.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        system_part_missing("needs Debian's chromium and chromium-driver: bash .ci/setup.d/20-browser.sh")
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver_process = psutil.Process(driver.service.process.pid)
    started = [driver_process.pid] + [p.pid for p in driver_process.children(recursive=True)]
    try:
        yield driver
    finally:
        driver.quit()
    assert wait_until(lambda: not pids_alive(started), 20), f"browser processes left: {pids_alive(started)}"


def test_the_widget_in_jupyterlab_turns_a_killed_proc_failed(lab, browser):
    url, token, server, api = lab
    browser.get(f"{url}/lab/tree/health.ipynb?token={token}")
    assert wait_until(lambda: browser.execute_script(KERNEL_IDLE_JS), 90, 0.25), "notebook or kernel never ready"
    browser.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")

    proc = NODE.format("proc:browser/1")
    assert wait_until(lambda: browser.execute_script(STATE_JS, proc) == "healthy", 90, 0.25), (
        "the widget never showed proc browser/1 healthy")
    # Every process behind the notebook (kernel, hub, host agent, procs), to check they end.
    behind = [p.pid for p in psutil.Process(server.pid).children(recursive=True)]

    # Levels open and close with a click (a comm round trip to the kernel).
    mesh_toggle = browser.find_element(By.XPATH, '//*[@data-mnb-node="mesh:workers"]'
                                                 '/ancestor::div[contains(@class, "widget-hbox")][1]//button')
    mesh_toggle.click()
    actor = NODE.format("mesh:workers/1")
    assert wait_until(lambda: browser.execute_script(STATE_JS, actor) == "healthy", 30, 0.1)

    text = browser.find_element(By.CSS_SELECTOR, proc).text
    pid = int(re.search(r"pid (\d+)", text).group(1))
    assert pid in behind  # the notebook's own proc, not some other process
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: browser.execute_script(STATE_JS, proc) == "failed", 30, 0.1), (
        "the widget never showed the killed proc failed")
    assert "killed by SIGKILL" in browser.find_element(By.CSS_SELECTOR, proc).text
    assert wait_until(lambda: browser.execute_script(STATE_JS, actor) == "failed", 10, 0.1)
    assert browser.execute_script(STATE_JS, NODE.format("proc:browser/0")) == "healthy"
    summary = browser.find_element(By.CSS_SELECTOR, NODE.format("cluster")).text
    assert "1/2 procs healthy" in summary and "1 failed" in summary

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});",
                           browser.find_element(By.CSS_SELECTOR, proc))
    assert browser.save_screenshot(str(ARTIFACTS / "health_widget.png"))

    for kernel in api("/api/kernels"):
        api(f"/api/kernels/{kernel['id']}", "DELETE")
    assert wait_until(lambda: not pids_alive(behind), 30), f"left behind: {pids_alive(behind)}"
