"""The router's token healing for engines that have none: what the prompt leaves out of the cursor's line, and the
answer's check that it writes that text again before anything else (router/healing.py)."""

import pytest

from warmpath.api.cutters import Chain
from warmpath.api.scope import Scope
from warmpath.router.healing import Respell, given_back


@pytest.mark.parametrize("prefix, back", [
    ("x = self.fo", "fo"),  # inside a word: the word so far
    ("    foo(", "    foo("),  # a word and one mark after it: the prompt ends at the line's start
    ("    @decorator(", "decorator("),  # a mark before the word stays
    ("if a ==", "="),  # two marks: only the last
    ("return ", " "),  # blanks after a word: only the blanks
    ("f(a, ", " "),  # blanks after a mark: only the blanks
    ("def f():\n", ""),  # at a line's start: nothing
    ("", ""),
    ("naïve_cafés", "naïve_cafés"),  # a word in any script
    ("a\n\t", "\t"),  # the line so far is blanks
])
def test_the_prompt_gives_back_the_cursor_lines_last_word(prefix, back):
    assert given_back(prefix) == back


def test_an_answer_that_writes_the_text_again_has_it_dropped_token_by_token():
    r = Respell("    ret")
    assert [r.feed(d) for d in ("  ", "  r", "eturn", " x", "\n")] == ["", "", "urn", " x", "\n"]
    assert not r.cut


def test_an_answer_that_writes_something_else_is_silence():
    r = Respell("fo")
    assert r.feed("b") == "" and r.cut and r.feed("ar(x)") == ""
    short = Respell("foo(")
    assert short.feed("foo") == "" and not short.cut
    assert short.feed("", final=True) == "" and short.cut  # ended before writing it all


def test_the_scope_cuts_what_follows_the_text_written_again():
    prefix, suffix = "    total = sum(it", ")\n    return total\n"
    chain = Chain(Respell(given_back(prefix)), Scope(prefix, suffix))
    out = chain.feed("ite") + chain.feed("ms")
    out += chain.feed(")\n    return total\n") if not chain.cut else ""
    assert out == "ems" and chain.cut
