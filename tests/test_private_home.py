"""The home (MONARCH_NB_HOME) must be this user's alone: another local user who made it
first, or who may write in it or a folder above it, could swap ``clusters/NAME`` for a
folder of theirs while the hub rewrites ``cluster.json``, take the key and run code as
the cluster's owner (the security review's reproducer: 3 of 3), or read a stopped
cluster's log store through a ``stopped/`` folder they made. Fast: no cluster runs."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from monarch_nb import cluster_dir, private_paths
from monarch_nb.hub import logstore

from conftest import system_part_missing
from second_user import other_user


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "home"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("MONARCH_NB_HOME", str(folder))
    return folder


def test_a_home_of_this_user_alone_is_taken(home, monkeypatch):
    path, info = cluster_dir.create("mine")
    assert cluster_dir.read_info(path) == info
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    monkeypatch.setenv("MONARCH_NB_HOME", str(home / "not" / "made" / "yet"))
    cluster_dir.make_folder(cluster_dir.clusters_root())  # made 0700, parents by the umask: ours
    assert private_paths.unsafe_folder(home / "not" / "made" / "yet") is None


def test_a_home_another_user_made_first_is_refused_before_anything_is_written(home):
    owner = other_user()
    os.chown(home, owner.pw_uid, owner.pw_gid)
    with pytest.raises(ValueError, match=rf"^MONARCH_NB_HOME={home} is not yours alone: {home} belongs to another "
                                         rf"user \({owner.pw_name}, uid {owner.pw_uid}\)\. Another local user could "
                                         "take this cluster's key"):
        cluster_dir.create("theirs")
    assert os.listdir(home) == []


@pytest.mark.parametrize("others", ["every user", "another user's group"])
def test_a_home_others_may_write_is_refused(home, others):
    if others == "every user":
        os.chmod(home, 0o777)
    else:
        os.chown(home, os.geteuid(), other_user().pw_gid)
        os.chmod(home, 0o770)
    with pytest.raises(ValueError, match=r"may be written by other users \(mode 7[70]{2}\)"):
        cluster_dir.make_folder(cluster_dir.clusters_root())


def test_a_home_its_users_own_group_may_write_is_taken(home):
    # umask 002 systems make folders group-writable for the user's private group.
    os.chmod(home, 0o770)
    if not private_paths._own_group(os.stat(home).st_gid):
        system_part_missing("a user private group (a group named as this user, with no other members)")
    cluster_dir.make_folder(cluster_dir.clusters_root())


def test_a_home_under_a_folder_others_may_write_is_refused_unless_that_folder_is_sticky(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "home").mkdir(mode=0o700)
    monkeypatch.setenv("MONARCH_NB_HOME", str(shared / "home"))
    os.chmod(shared, 0o777)  # another user may rename "home" away and put theirs in its place
    with pytest.raises(ValueError, match=rf"{shared}, a folder above it, may be written by other users"):
        cluster_dir.make_folder(cluster_dir.clusters_root())
    os.chmod(shared, 0o1777)  # as /tmp: others may not rename or remove what is ours
    cluster_dir.make_folder(cluster_dir.clusters_root())


def test_a_home_reached_through_another_users_link_is_refused(tmp_path, monkeypatch):
    owner = other_user()
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    os.lchown(link, owner.pw_uid, owner.pw_gid)  # they may point it at a folder of theirs later
    monkeypatch.setenv("MONARCH_NB_HOME", str(link))
    with pytest.raises(ValueError, match=rf"{link} is a link of another user \({owner.pw_name}\)"):
        cluster_dir.read_info(link / "clusters" / "x")


def test_cluster_json_is_never_written_through_a_file_or_link_planted_at_a_guessable_name(home):
    path, info = cluster_dir.create("planted")
    bait = home / "bait"
    bait.write_text("untouched")
    for guess in (f".cluster.json.{os.getpid()}.tmp", ".cluster.json.tmp"):  # the old name had the writer's pid
        (path / guess).symlink_to(bait)
    cluster_dir.write_json(path / "cluster.json", {**info, "hub": "tcp://127.0.0.1:1"})
    assert bait.read_text() == "untouched"
    assert json.loads((path / "cluster.json").read_text())["hub"] == "tcp://127.0.0.1:1"
    assert sorted(p.name for p in path.iterdir()) == sorted(
        ["cluster.json", f".cluster.json.{os.getpid()}.tmp", ".cluster.json.tmp"])  # no temporary file left


def test_a_stopped_folder_another_user_made_does_not_get_the_log_store(home, tmp_path, capsys):
    owner = other_user()
    stopped = home / "stopped"
    stopped.mkdir(mode=0o777)
    os.chown(stopped, owner.pw_uid, owner.pw_gid)
    db = tmp_path / "lines.sqlite"
    db.write_text("what the actors printed")
    logstore.keep(db, stopped / "c.sqlite")
    assert os.listdir(stopped) == [] and db.exists()
    assert "belongs to another user" in capsys.readouterr().err
    os.chown(stopped, os.geteuid(), os.getegid())
    os.chmod(stopped, 0o700)
    logstore.keep(db, stopped / "c.sqlite")
    assert stat.S_IMODE(os.stat(stopped / "c.sqlite").st_mode) == 0o600
