"""An answer judged as the editor inserted it, in the real file.

- exact: the file after the insertion is the real file (trailing whitespace of each line aside): the
  answer is right and whole, and wrote nothing more;
- newline cut: the same, inserting only the answer's first line, as a client that cuts at the
  newline does (a hole of several lines is never filled so);
- first line: the answer's first line is the middle's first line (on the cursor's line, with what
  follows the cursor there when the middle is one line);
- similarity: 1 - the edit distance between what the cursor's region became and what it really is,
  over the longer's length (the region: from the start of the cursor's line to the end of the hole);
- chars: the characters inserted."""

from __future__ import annotations

from dataclasses import dataclass

from warmpath.eval.editors import Buffer, Insertion, levenshtein
from warmpath.eval.holes import Hole


@dataclass(frozen=True)
class Verdict:
    exact: bool
    newline_cut: bool
    first_line: bool
    similarity: float
    chars: int


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.rstrip().split("\n")]


def judge(hole: Hole, ins: Insertion) -> Verdict:
    b = Buffer(hole)
    exact = _lines(ins.apply(hole)) == _lines(hole.text)
    first = Insertion(ins.text.split("\n", 1)[0], ins.from_line_start, ins.replaces)
    newline_cut = _lines(first.apply(hole)) == _lines(hole.text)
    rest = b.after[ins.replaces:]
    got = ("" if ins.from_line_start else b.line_before) + ins.text
    want = b.line_before + hole.middle + b.after[:ins.replaces]
    # the rest of the cursor's line stays after an inserted first line; with a hole of several
    # lines, the real rest of that line is on the hole's last line, so only the lines' starts are
    # compared
    line_rest = rest.split("\n", 1)[0] if "\n" not in hole.middle else ""
    got_line = got.split("\n", 1)[0] + line_rest
    want_line = want.split("\n", 1)[0] + line_rest
    g, w = "\n".join(_lines(got)), "\n".join(_lines(want))
    similarity = 1.0 - levenshtein(g, w) / max(1, len(g), len(w))
    return Verdict(exact, newline_cut,
                   got_line.rstrip() == want_line.rstrip(), similarity, len(ins.text))
