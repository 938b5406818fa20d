"""What one line of code says, whatever the language: its indentation, the brackets it leaves open,
whether its statement goes on below. The completion scope (api/scope.py) reads answers with it."""

from __future__ import annotations

OPENERS = (":", "{", "(", "[")  # a line ending in one opens a block
CLOSERS = ("}", ")", "]")  # a line starting with one at the opener's indent closes it
# A line ending in one goes on below (a block, a continued expression): its statement is not
# complete.
CONTINUES = (":", "{", "(", "[", ",", "\\", "=", "+", "-", "*", "/", "%", "&", "|", ".")


def unbalanced(line: str) -> int:
    """Brackets a line leaves unmatched: closers with nothing open, and openers still open at its
    end."""
    depth = unmatched = 0
    for ch in line:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth:
                depth -= 1
            else:
                unmatched += 1
    return unmatched + depth


def indent_step(text: str) -> int:
    """The file's indentation step: the commonest increase between consecutive lines with code (4
    when none)."""
    steps: dict[int, int] = {}
    last = None
    for line in text.split("\n")[-400:]:
        if line.strip():
            width = indent(line)
            if last is not None and width > last:
                steps[width - last] = steps.get(width - last, 0) + 1
            last = width
    return max(steps, key=lambda k: (steps[k], -k)) if steps else 4


def indent(line: str) -> int:
    """Leading spaces and tabs, one column each (as llama.cpp's n_indent counts)."""
    return len(line) - len(line.lstrip(" \t"))
