"""No other local user gets at a paused rank: the attacks of issue 22, run as a second
user (``second_user``) against a real cluster with an armed proc and a real relay.

- A proc's debugger: pydevd used to keep a loopback TCP port for the rest of the
  proc's life once armed; DAP has no authentication, so any user who connected ran code
  as the owner (and broke the owner's own session).
- The IDE relay: a 127.0.0.1 port whose first connection drove the paused rank.
- Cell files for breakpoints: written under ``/tmp/ipykernel_PID/`` through a
  predictable temporary name another user could plant as a symlink.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import time

import pytest

from monarch_nb.debug import arming
from monarch_nb.debug.dap import DapClient, Parser, encode

from conftest import wait_until
from debug_actors import Paused
from second_user import listeners_of, other_user, run_as_other_user

pytest.importorskip("debugpy")

AS_OWNER = "__import__('os').geteuid()"  # what the attacker evaluates in the paused frame


def _drive(sock: socket.socket, wait_s: float) -> dict:
    """As an attacker with a DAP connection: initialize, attach, find a paused thread and
    evaluate ``AS_OWNER`` in its top frame. Returns what got answered: ``{"answered":
    False}`` when the peer said nothing DAP within ``wait_s`` s (or closed)."""
    parser, seq, pending = Parser(), 0, []
    sock.settimeout(wait_s)

    def request(command: str, **arguments) -> dict | None:
        nonlocal seq
        seq += 1
        sock.sendall(encode({"seq": seq, "type": "request", "command": command, "arguments": arguments}))
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            for message in pending:
                if message.get("type") == "response" and message.get("request_seq") == seq:
                    pending.remove(message)
                    return message
            try:
                data = sock.recv(1 << 16)
                if not data:
                    return None
                pending.extend(parser.feed(data))
            except (OSError, ValueError):
                return None
        return None

    try:
        answer = request("initialize", clientID="intruder", adapterID="debugpy", pathFormat="path")
    except OSError:
        answer = None
    if answer is None or not answer.get("success"):
        return {"answered": False}
    request("attach", justMyCode=False)
    request("configurationDone")
    threads = (request("threads") or {}).get("body", {}).get("threads", [])
    for thread in threads:
        frames = (request("stackTrace", threadId=thread["id"]) or {}).get("body", {}).get("stackFrames", [])
        if frames:
            result = request("evaluate", expression=AS_OWNER, frameId=frames[0]["id"], context="repl")
            if result and result.get("success"):
                return {"answered": True, "ran_as": int(result["body"]["result"])}
    return {"answered": True, "ran_as": None}


def _attack_ports(ports: list[int]) -> dict:
    """As the second user: DAP on each loopback ``port`` (an attacker reads them in
    /proc/net/tcp). Returns how many answered DAP and, where one let us evaluate, as
    whom the code ran."""
    answered, ran_as = 0, []
    for port in ports:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            continue
        try:
            outcome = _drive(sock, 5.0)
        finally:
            sock.close()
        if outcome["answered"]:
            answered += 1
            if outcome.get("ran_as") is not None:
                ran_as.append(outcome["ran_as"])
    return {"dap_ports": answered, "ran_as": ran_as}


@pytest.fixture(scope="module")
def armed_mesh(host):
    procs = host.spawn_procs(per_host={"gpus": 1}, name="secured")
    yield procs.spawn("secured", Paused)
    procs.stop()


def test_no_other_user_reaches_the_debugger_of_an_armed_proc(cluster, armed_mesh):
    other_user()  # skip early where there is no second user
    dbg = cluster.debugger
    future = armed_mesh.work.call_one(1)
    stop = dbg.wait_paused(1, "secured", timeout=60)[0]  # armed, and paused: the attacker's best moment
    ports = sorted(listeners_of(stop.pid))  # the proc's zmq inbox is among them: it only takes signed frames
    outcome = run_as_other_user(_attack_ports, ports, timeout=120)
    assert outcome == {"dap_ports": 0, "ran_as": []}, f"DAP answered another user on the proc's ports {ports}"
    # The owner's session is whole: eval, continue, and a later breakpoint() still stops.
    assert dbg.eval("y", "secured")[("secured", 0)] == "10"
    dbg.continue_("secured")
    assert future.get(timeout=30) == 11
    again = armed_mesh.work.call_one(2)
    dbg.wait_paused(1, "secured", timeout=60)
    dbg.continue_("secured")
    assert again.get(timeout=30) == 21


def _attack_relay(port: int) -> dict:
    """As the second user: connect to an IDE relay and drive the rank behind it."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        return {"connected": False, "answered": False}
    try:
        return {"connected": True, **_drive(sock, 10.0)}
    finally:
        sock.close()


def test_the_ide_relay_refuses_another_user_counts_it_and_still_serves_the_owner(cluster, armed_mesh):
    other_user()
    dbg = cluster.debugger
    refused_before = cluster.health()["hub"].get("relay_refused", 0)
    future = armed_mesh.work.call_one(3)
    dbg.wait_paused(1, "secured", timeout=60)
    relay = dbg.attach("secured", 0)
    try:
        outcome = run_as_other_user(_attack_relay, relay.port, timeout=120)
        assert not outcome["answered"], f"the relay let another user drive the rank: {outcome}"
        assert relay.refused == 1
        health = wait_until(lambda: (h := cluster.health())["hub"].get("relay_refused") == refused_before + 1
                            and h, 10)
        assert health, "the hub's health does not count the refused connection"
        assert f"{refused_before + 1} debugger connection(s) refused" in health["summary"]
        # The owner's IDE gets in after it (the refused one took no slot).
        ide = DapClient.connect("127.0.0.1", relay.port)
        try:
            capabilities = ide.request("initialize", clientID="vscode", adapterID="debugpy", pathFormat="path")
            assert capabilities.get("supportsConfigurationDoneRequest")
        finally:
            ide.close()
    finally:
        relay.close()
    dbg.continue_("secured")
    assert future.get(timeout=30) == 31


# cell files ----------------------------------------------------------------------------
CELL = "def f():\n    return 42\n"


def _plant(folder: str, name: str, target: str) -> list[str]:
    """As the second user: make ``folder`` (0777, as an attacker would) and plant a
    symlink to ``target`` at the temporary name the writer (the test process: our
    parent) would use, ``NAME.PID.tmp``."""
    os.mkdir(folder)
    os.chmod(folder, 0o777)
    link = os.path.join(folder, f"{name}.{os.getppid()}.tmp")
    os.symlink(target, link)
    return [link]


@pytest.fixture
def cell_folder():
    folder = os.path.join(tempfile.gettempdir(), f"ipykernel_sec{os.getpid()}_{time.monotonic_ns()}")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_planted_symlink_in_another_users_cell_folder_is_not_followed(cell_folder, tmp_path, capfd):
    victim = tmp_path / "owners_file"
    victim.write_text("the owner's data\n")
    name = "4567.py"
    run_as_other_user(_plant, cell_folder, name, str(victim))
    arming.materialize(os.path.join(cell_folder, name), CELL)  # as a proc of the owner's does
    assert victim.read_text() == "the owner's data\n"
    assert not os.path.exists(os.path.join(cell_folder, name))
    err = capfd.readouterr().err
    assert f"{cell_folder} belongs to another user (monarchnb-other" in err and "remove" in err


def test_a_cell_file_is_written_in_a_private_folder_and_only_by_its_owner(cell_folder):
    path = os.path.join(cell_folder, "4567.py")
    arming.materialize(path, CELL)
    assert open(path).read() == CELL
    assert stat.S_IMODE(os.stat(cell_folder).st_mode) == 0o700
    assert not stat.S_IMODE(os.stat(path).st_mode) & 0o022
    assert os.listdir(cell_folder) == ["4567.py"]  # no temporary file left
    arming.materialize(path, "changed = True\n")  # there already: the same cell's text, kept
    assert open(path).read() == CELL


def test_a_cell_file_is_not_written_in_a_folder_others_may_write(cell_folder, capfd):
    os.mkdir(cell_folder)
    os.chmod(cell_folder, 0o777)
    arming.materialize(os.path.join(cell_folder, "4567.py"), CELL)
    assert os.listdir(cell_folder) == []
    assert "may be written by other users (mode 777)" in capfd.readouterr().err


def test_peer_uid_reads_the_owner_of_the_connecting_socket():
    from monarch_nb.debug.peer import peer_uid, uid_in

    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    try:
        assert peer_uid(conn) == os.geteuid()
    finally:
        for s in (conn, client, server):
            s.close()
    table = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
             "   0: 0100007F:D76A 0100007F:8D79 01 00000000:00000000 00:00000000 00000000   999        0 78609\n")
    assert uid_in(table, ("127.0.0.1", 0xD76A), ("127.0.0.1", 0x8D79)) == 999
    assert uid_in(table, ("127.0.0.1", 0xD76B), ("127.0.0.1", 0x8D79)) is None
