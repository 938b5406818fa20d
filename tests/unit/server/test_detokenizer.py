"""Incremental detokenization: deltas concatenate to the full text, never half a character, stop
strings cut across token boundaries without leaking a partial stop."""

import pytest
from tiny_model import tiny_tokenizer

from warmpath.models.tokenizer import Tokenizer
from warmpath.server.detokenizer import IncrementalDetokenizer

TEXT = "def f():\n    return 'π ≈ 3.14 🙂🚀 日本語'  # done\n"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer(tiny_tokenizer(), eos_token_id=2)


def stream(det: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    deltas = [det.add([t]) for t in ids]
    deltas.append(det.finish())
    return deltas


def test_deltas_rebuild_the_text_and_never_split_characters(tok):
    ids = tok.encode(TEXT)
    # byte-level: multi-byte characters span several tokens
    assert len(ids) > len(TEXT.encode()) // 2
    deltas = stream(IncrementalDetokenizer(tok), ids)
    assert "".join(deltas) == TEXT
    assert all("\ufffd" not in d for d in deltas)


@pytest.mark.parametrize("stop,expected", [("return", "def f():\n    "),
                                           ("🚀", TEXT.split("🚀")[0]),
                                           ("# d", TEXT.split("# d")[0]), ("zzz", TEXT)])
def test_stop_strings_cut_and_never_leak(tok, stop, expected):
    det = IncrementalDetokenizer(tok, stop=[stop, "never-there"])
    deltas = stream(det, tok.encode(TEXT))
    assert "".join(deltas) == expected
    shown = ""
    for d in deltas:  # at no point was any part of the stop string shown
        shown += d
        assert stop not in shown
    assert det.stopped == (stop != "zzz")


def test_earliest_of_several_stops_wins(tok):
    det = IncrementalDetokenizer(tok, stop=["# done", "3.14"])
    assert "".join(stream(det, tok.encode(TEXT))) == TEXT.split("3.14")[0]
