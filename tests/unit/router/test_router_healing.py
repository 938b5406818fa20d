"""The router's token healing for engines that have none: what the prompt leaves out of the cursor's
line, the engine's constraint to write it again first, and the answer's check that it did
(router/healing.py)."""

import json
import re

import pytest

from warmpath.api.cutters import Chain
from warmpath.api.scope import ScopeCutter
from warmpath.router.healing import Respell, constraint, given_back, respelled
from warmpath.router.nodes import Node
from warmpath.router.scoping import body_cutter
from warmpath.router.upstream import heals, request_body


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
    chain = Chain(Respell(given_back(prefix)), ScopeCutter(prefix, suffix))
    out = chain.feed("ite") + chain.feed("ms")
    out += chain.feed(")\n    return total\n") if not chain.cut else ""
    assert out == "ems" and chain.cut


@pytest.mark.parametrize("kind, field", [("llamacpp", "grammar"), ("vllm", "structured_outputs"),
                                         ("sglang", "regex")])
def test_the_engine_is_told_to_begin_with_the_text_given_back(kind, field):
    """The FIM prompt a node gets ends before the given-back text (anchored layout), and the body
    constrains the answer to begin with it, in the engine's own terms; an engine that cannot be
    constrained is not healed."""
    node = Node("http://n:1", kind=kind, models=["qwen2.5-coder-0.5b"])
    body = {
        "prompt": "def f(items):\n    total = sum(it", "suffix": ")\n    return total\n",
        "max_tokens": 8
    }
    sent = json.loads(request_body(node, body, None, own_model=False, give_back="it"))
    assert sent["prompt"].endswith("<|fim_middle|>    total = sum(") and field in sent
    rule = sent[field]["regex"] if field == "structured_outputs" else sent[field]
    assert rule in ('root ::= "it" [^\\x00]*', "it[\\s\\S]*")
    assert heals(node.engine) and not heals(Node("http://n:1", kind="openai").engine)
    assert not heals(Node("http://n:1", kind="warmpath").engine)  # it heals itself


def test_a_client_that_constrains_the_answer_itself_is_not_healed():
    prefix, suffix = "x = self.fo", "\n"
    assert given_back(prefix) == "fo"
    chain = body_cutter({"prompt": prefix, "suffix": suffix}, "qwen2.5-coder-0.5b", "auto",
                        heal=True)
    assert respelled(chain) == "fo"
    own = body_cutter({"prompt": prefix, "suffix": suffix, "grammar": "root ::= [a-z]+"},
                      "qwen2.5-coder-0.5b", "auto", heal=True)
    assert respelled(own) == ""


@pytest.mark.parametrize("text", ['    foo("', "\tx.y(", "é_1[", "a\\", "s-"])
def test_the_constraints_accept_exactly_answers_that_begin_with_the_text(text):
    pattern = constraint("regex", text)["regex"]
    assert re.fullmatch(pattern, text + "rest\n of it") and not re.fullmatch(pattern, "x" + text)
