"""The notebook's line gate (fast, no processes): actor lines land between the cell's
own lines, never inside one, and never wait without a bound."""

from __future__ import annotations

from monarch_nb.notebook import line_gate
from monarch_nb.notebook.line_gate import LineGate


class Stream:
    """What the kernel's stdout is to the gate: something with ``write``."""

    def __init__(self):
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def actor_line(text: str):
    return lambda write: write(f"{text}\n")


def test_an_actor_line_that_comes_mid_print_waits_for_the_cells_line_to_end():
    # print("own 2", "v2 end") writes "own 2", " ", "v2 end", "\n": the actor line came
    # after the first (issue 23: "own 2 [w 0-1] chatter 0 from the actor" then "v2 end").
    stream, gate = Stream(), LineGate(Clock())
    gate.install(stream)
    stream.write("own 2")
    gate.write(stream, actor_line("[w 0-1] chatter"), hold=True)
    stream.write(" ")
    stream.write("v2 end")
    assert stream.text == "own 2 v2 end"  # held while the cell's line is open
    stream.write("\n")
    assert stream.text == "own 2 v2 end\n[w 0-1] chatter\n"


def test_a_print_of_several_parts_is_never_split_by_actor_lines():
    stream, gate = Stream(), LineGate(Clock())
    gate.install(stream)
    gate.write(stream, actor_line("[w 0] first"), hold=True)  # at a line's start: at once
    print("a", "b", "c", file=stream)
    gate.write(stream, actor_line("[w 0] second"), hold=True)
    assert stream.text.splitlines() == ["[w 0] first", "a b c", "[w 0] second"]


def test_lines_for_another_cell_and_lines_held_too_long_are_not_kept_waiting():
    clock, stream = Clock(), Stream()
    gate = LineGate(clock)
    gate.install(stream)
    stream.write("spinner ")  # a cell that keeps its line open
    gate.write(stream, actor_line("[w 0] for a finished cell"), hold=False)
    assert stream.text.endswith("[w 0] for a finished cell\n")
    stream.text = ""
    stream.write("still open")
    gate.write(stream, actor_line("[w 0] held"), hold=True)
    assert "held" not in stream.text
    clock.now += line_gate.HOLD_S + 0.1
    stream.write(".")  # the next write of the cell finds it overdue
    assert stream.text == "still open.\n[w 0] held\n"


def test_the_cells_end_releases_what_is_held_and_uninstall_restores_write():
    stream, gate = Stream(), LineGate(Clock())
    original = stream.write
    gate.install(stream)
    stream.write("no newline at the end")
    gate.write(stream, actor_line("[w 0] late"), hold=True)
    gate.release()
    assert stream.text == "no newline at the end\n[w 0] late\n"
    gate.uninstall()
    assert stream.write == original
