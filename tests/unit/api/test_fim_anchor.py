"""The anchored FIM layout (api/fim.py): typing along a line or down a file leaves the prompt before
the middle marker as it was, so the prefix cache keeps context, prefix and suffix from keystroke to
keystroke; the cut depends on the text alone."""

import sysconfig
from pathlib import Path

import pytest

from warmpath.api.fim import ANCHOR_WINDOW, FIM_TEMPLATES, anchor

QWEN = next(t for t in FIM_TEMPLATES if t.name == "qwen2.5-coder")
CODESTRAL = next(t for t in FIM_TEMPLATES if t.name == "codestral")
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def code_lines(name: str) -> list[str]:
    return (STDLIB / name).read_text().split("\n")


def before_middle(prompt: str) -> str:
    return prompt[:prompt.index("<|fim_middle|>")]


def test_the_prefix_and_the_lines_after_the_cut_make_the_same_document():
    prefix = ("import os\n\n\ndef walk(top):\n    for root, dirs, files in os.walk(top):\n"
              "        yield ro")
    suffix = "\n\nprint(list(walk('.')))\n"
    prompt = QWEN.build(prefix, suffix, layout="anchored")
    cut = anchor(prefix)
    assert prefix[cut - 1] == "\n"
    assert prompt == (f"<|fim_prefix|>{prefix[:cut]}<|fim_suffix|>{suffix}"
                      f"<|fim_middle|>{prefix[cut:]}")
    assert QWEN.build(prefix,
                      suffix) == f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"


def test_typing_along_a_line_changes_nothing_before_the_middle_marker():
    lines = code_lines("json/decoder.py")
    above, line = "\n".join(lines[:200]) + "\n", lines[200]
    suffix = "\n".join(lines[201:230])
    prompts = [
        QWEN.build(above + line[:i], suffix, layout="anchored") for i in range(len(line) + 1)
    ]
    assert len({before_middle(p) for p in prompts}) == 1
    plain = [QWEN.build(above + line[:i], suffix) for i in range(len(line) + 1)]
    # the cursor layout: a new prompt per key
    assert len({before_middle(p) for p in plain}) == len(line) + 1


@pytest.mark.parametrize("name", ["json/decoder.py", "argparse.py", "asyncio/base_events.py"])
def test_going_down_a_file_the_cut_moves_rarely_and_never_up(name):
    lines = code_lines(name)
    cuts = [anchor("\n".join(lines[:i]) + "\n") for i in range(1, len(lines))]
    assert all(a <= b for a, b in zip(cuts, cuts[1:]))  # noqa: B905
    moves = sum(a != b for a, b in zip(cuts, cuts[1:]))  # noqa: B905
    # a minimizer over 24 lines: ~2 / 25 of lines, more with repeated lines
    assert moves < 0.15 * len(lines)
    for i, cut in enumerate(cuts, start=1):  # the middle holds at most the window's lines
        assert ("\n".join(lines[:i]) + "\n")[cut:].count("\n") <= ANCHOR_WINDOW


def test_the_cut_depends_on_the_text_alone():
    lines = code_lines("argparse.py")[:300]
    text = "\n".join(lines) + "\n    x"
    assert anchor(text) == anchor(text)
    # the same lines with another above the window: the same cut line
    shifted = "# a header line\n" + text
    assert shifted[anchor(shifted):] == text[anchor(text):]


def test_a_prefix_without_a_complete_line_is_all_middle():
    assert anchor("def f(") == 0
    assert QWEN.build("def f(", ")",
                      layout="anchored") == "<|fim_prefix|><|fim_suffix|>)<|fim_middle|>def f("


def test_suffix_first_families_keep_their_layout():
    prefix = "a = 1\nb = 2\nc"
    assert CODESTRAL.build(prefix, "\nprint(c)",
                           layout="anchored") == CODESTRAL.build(prefix, "\nprint(c)")


def test_an_unknown_layout_is_refused():
    with pytest.raises(ValueError, match="anchored"):
        QWEN.build("a", "b", layout="spm")
