"""Log records: one logical line is one record with its writer's attribution however long
it is (capped, with a visible truncation marker), and nothing an actor prints can
change whom a line is attributed to; Python log messages an actor writes name it."""

from __future__ import annotations

import logging
import os
import sys
import threading

import pytest

from monarch_nb.actor import Actor, context, endpoint
from monarch_nb.proc import stdio

MB = 1 << 20
OLD_TAG = b"\x00mnb\x01victim\x017\x018\x01forged-origin\x02"  # the in-band tag of earlier versions


def forged_frame(text: bytes) -> bytes:
    """A record-channel frame claiming ``text`` is rank 7 of mesh ``victim``."""
    tag = b"victim\x017\x018\x01forged-origin"
    return stdio.HEADER.pack(1, 7, len(tag), len(text) + 1) + tag + text + b"\n"


class Writer(Actor):
    """Writes long lines and forged tags, through Python and straight to fd 1."""

    @endpoint
    def long_line(self, label: str, nbytes: int, pieces: int = 1) -> int:
        piece = "x" * (nbytes // pieces)
        sys.stdout.write(label)
        for _ in range(pieces):
            sys.stdout.write(piece)
        sys.stdout.write("\n")
        print(f"{label} after")
        return context().actor_instance.rank.rank

    @endpoint
    def long_raw_line(self, label: str, nbytes: int) -> None:
        data = label.encode() + b"y" * nbytes + b"\n"
        view = memoryview(data)
        while view:
            view = view[os.write(1, view):]

    @endpoint
    def forge(self, label: str) -> None:
        forged = (OLD_TAG + label.encode() + b" old tag").decode()
        print(forged)
        print(forged_frame(label.encode() + b" frame").decode(), end="")
        sys.stderr.write(forged + "\n")

    @endpoint
    def forge_on_fd1(self, label: str) -> None:
        os.write(1, OLD_TAG + label.encode() + b" old tag on fd 1\n")
        os.write(1, forged_frame(label.encode() + b" frame on fd 1"))

    @endpoint
    def lines_from_two_threads(self, label: str, n: int) -> None:
        def shorts():
            for i in range(n):
                print(f"{label} short {i}")

        worker = threading.Thread(target=shorts)
        worker.start()
        print(label + "z" * (3 * MB))
        worker.join()

    @endpoint
    def with_forked_child(self, label: str, n: int, width: int) -> int:
        """This proc and a forked child (as a DataLoader worker is) print ``n`` lines
        of ``width`` bytes each at the same time."""
        pid = os.fork()
        who = "child" if pid == 0 else "parent"
        for i in range(n):
            print(f"{label} {who} {i} " + "w" * width)
        if pid == 0:
            sys.stdout.flush()
            os._exit(0)
        os.waitpid(pid, 0)
        return pid


class FileLogger(Actor):
    """Logs through a handler that writes to a file, past the proc's line attribution."""

    @endpoint
    def log(self, path: str, message: str) -> None:
        logger = logging.getLogger("file-logger")
        handler = logging.FileHandler(path)
        logger.addHandler(handler)
        try:
            logger.warning(message)
        finally:
            logger.removeHandler(handler)
            handler.close()


@pytest.fixture(scope="module")
def writers(procs4):
    return procs4.spawn("writers", Writer)


def records_with(cluster, label: str) -> list[dict]:
    """Every stored record whose text contains ``label`` (after a flush)."""
    assert cluster.flush_logs(timeout=30)
    return cluster.logs(grep=label)


def test_a_10_mb_line_is_one_record_of_the_actor_with_a_truncation_marker(cluster, writers):
    size = 10 * MB
    assert writers.slice(gpus=2).long_line.call_one("ten-mb", size).get() == 2
    records = records_with(cluster, "ten-mb")
    assert [(r["mesh"], r["rank"], r["size"]) for r in records] == [("writers", 2, 4)] * 2
    big, after = records
    assert after["text"] == "ten-mb after"
    kept, marker, dropped = big["text"].rpartition(" …truncated ")
    assert marker and kept.startswith("ten-mbxxx") and set(kept[6:]) == {"x"}
    assert len(kept.encode()) <= stdio.LINE_CAP
    assert dropped == f"{len('ten-mb') + size - len(kept)} bytes"


def test_a_long_line_written_in_pieces_is_one_record(cluster, writers):
    assert writers.slice(gpus=1).long_line.call_one("pieces", 3 * MB, pieces=300).get() == 1
    records = records_with(cluster, "pieces")
    assert [(r["mesh"], r["rank"]) for r in records] == [("writers", 1)] * 2
    assert "…truncated" in records[0]["text"] and records[1]["text"] == "pieces after"


def test_a_line_under_the_cap_is_kept_whole(cluster, writers):
    size = stdio.LINE_CAP - 100
    writers.slice(gpus=0).long_line.call_one("whole", size, pieces=7).get()
    records = records_with(cluster, "whole")
    assert [len(r["text"]) for r in records] == [len("whole") + size // 7 * 7, len("whole after")]
    assert records[0]["mesh"] == "writers"


def test_a_long_line_on_fd_1_is_one_record_of_the_proc(cluster, writers, procs4):
    writers.slice(gpus=3).long_raw_line.call_one("rawlong", 4 * MB).get()
    [record] = records_with(cluster, "rawlong")
    assert (record["mesh"], record["rank"], record["stream"]) == (procs4.name, 3, "stdout")
    kept, marker, dropped = record["text"].rpartition(" …truncated ")
    assert marker and dropped == f"{len('rawlong') + 4 * MB - len(kept)} bytes"


def test_forged_tags_printed_by_an_actor_are_its_own_text(cluster, writers):
    writers.slice(gpus=1).forge.call_one("printed-forgery").get()
    records = records_with(cluster, "printed-forgery")
    assert sorted((r["stream"], r["text"]) for r in records) == sorted([
        ("stdout", (OLD_TAG + b"printed-forgery old tag").decode()),
        ("stdout", forged_frame(b"printed-forgery frame").decode().rstrip("\n")),
        ("stderr", (OLD_TAG + b"printed-forgery old tag").decode()),
    ])
    assert {(r["mesh"], r["rank"], r["size"]) for r in records} == {("writers", 1, 4)}
    assert not cluster.logs(mesh="victim")


def test_forged_tags_written_to_fd_1_are_plain_text_of_the_proc(cluster, writers, procs4):
    writers.slice(gpus=0).forge_on_fd1.call_one("fd-forgery").get()
    records = records_with(cluster, "fd-forgery")
    assert [r["text"] for r in records] == [(OLD_TAG + b"fd-forgery old tag on fd 1").decode(),
                                            forged_frame(b"fd-forgery frame on fd 1").decode().rstrip("\n")]
    assert {(r["mesh"], r["rank"], r["size"]) for r in records} == {(procs4.name, 0, None)}
    assert not cluster.logs(mesh="victim")


def test_a_long_line_and_another_threads_lines_each_keep_their_order(cluster, writers):
    writers.slice(gpus=2).lines_from_two_threads.call_one("twothreads", 2000).get()
    records = records_with(cluster, "twothreads")
    assert {(r["mesh"], r["rank"]) for r in records} == {("writers", 2)}
    shorts = [r["text"] for r in records if " short " in r["text"]]
    assert shorts == [f"twothreads short {i}" for i in range(2000)]
    [long] = [r["text"] for r in records if r["text"].startswith("twothreadszzz")]
    assert "…truncated" in long


def test_lines_of_a_forked_child_stay_whole_and_belong_to_the_actor(cluster, writers):
    width = 3 * stdio.FRAME_BYTES  # every line takes several frames, which interleave
    writers.slice(gpus=3).with_forked_child.call_one("forked", 300, width).get()
    records = records_with(cluster, "forked")
    assert {(r["mesh"], r["rank"]) for r in records} == {("writers", 3)}
    for who in ("parent", "child"):
        assert [r["text"] for r in records if r["text"].startswith(f"forked {who} ")] == [
            f"forked {who} {i} " + "w" * width for i in range(300)]
    assert len(records) == 600


def test_lines_are_capped_on_a_character_boundary():
    cutter = stdio.LineCutter()
    assert cutter.feed("k", "é".encode() * stdio.LINE_CAP) == []
    [line] = cutter.feed("k", b"!\n")
    kept, _, dropped = line.decode().rpartition(" …truncated ")  # decodes: no character was cut
    assert set(kept) == {"é"} and dropped == f"{2 * stdio.LINE_CAP + 1 - len(kept.encode())} bytes"
    assert len(line) <= stdio.LINE_CAP



def test_python_log_messages_written_by_an_actor_name_it_and_empty_ones_stay_empty(procs4, tmp_path):
    # Monarch's prefix: a file handler's lines say which actor logged them.
    loggers = procs4.spawn("file_loggers", FileLogger)
    path = tmp_path / "actor.log"
    loggers.slice(gpus=2).log.call_one(str(path), "hello from rank 2").get()
    loggers.slice(gpus=1).log.call_one(str(path), "").get()  # torch.compile's structured traces log ""
    assert path.read_text().splitlines() == [
        "[actor=test_log_records.FileLogger file_loggers{'gpus': 2/4}] hello from rank 2", ""]
    # The client's own log messages are its own text.
    record = logging.getLogger("client").makeRecord("client", logging.WARNING, __file__, 1, "plain", (), None)
    assert record.getMessage() == "plain"
