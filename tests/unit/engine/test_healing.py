"""Token healing (engine/healing.py): a prompt's last token given back is spelled again by the
completion's first tokens, whatever the model prefers, and the text the answer shows starts after
it."""

import pytest
from engine_checks import code_texts
from tiny_model import tiny_tokenizer

from warmpath import EngineRequest, SamplingParams
from warmpath.config import EngineConfig
from warmpath.engine.engine import Engine
from warmpath.engine.healing import Healer
from warmpath.models.registry import load_tokenizer
from warmpath.models.tokenizer import Tokenizer
from warmpath.server.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def smollm2() -> Tokenizer:
    return load_tokenizer("smollm2")


@pytest.fixture(scope="module")
def healer(smollm2) -> Healer:
    return Healer(smollm2.token_bytes)


def test_token_bytes_spell_what_decode_spells(smollm2):
    pieces = smollm2.token_bytes
    assert pieces[smollm2.eos_token_id] is None  # special tokens are never a piece of text
    for text in ("def fib(n):\n    return fi", "  x = 'π ≈ 3.14'\n\n\tyield"):
        assert b"".join(pieces[i] for i in smollm2.encode(text)) == text.encode()


@pytest.mark.parametrize("heal", [b" fi", b"\n", b"        ret", b"(n", b"\xcf\x80"])
def test_the_allowed_tokens_are_exactly_those_that_keep_to_the_text(healer, smollm2, heal):
    allowed = set(healer.allowed(heal).tolist())
    expected = {
        i
        for i, p in enumerate(smollm2.token_bytes)
        if p and (p.startswith(heal) or heal.startswith(p))
    }
    assert allowed == expected and allowed


def test_advance_spells_the_rest(healer, smollm2):
    tid = {p: i for i, p in enumerate(smollm2.token_bytes) if p}
    assert healer.advance(b" fib", tid[b" f"]) == b"ib"
    assert healer.advance(b" fi", tid[b" fib"]) == b""
    assert healer.advance(b"\n", tid[b"\n"]) == b""


def test_the_detokenizer_drops_the_healed_text_before_stop_strings():
    tok = Tokenizer(tiny_tokenizer(), eos_token_id=2)
    ids = tok.encode("\n    return x\n    y")
    det = IncrementalDetokenizer(tok, stop=["\n"], heal="\n")  # the prompt ended at the newline
    assert "".join(det.add([t]) for t in ids) + det.finish() == "    return x"


def test_the_engine_spells_the_healed_text_first_then_runs_free(tiny_long_dir):
    engine = Engine(EngineConfig(model=str(tiny_long_dir), dtype="float32", num_kv_blocks=512))
    pieces = engine.tokenizer.token_bytes
    prompt = engine.tokenizer.encode(code_texts(1, 300, 300, seed=4)[0])
    free = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    engine.add_request(EngineRequest("free", prompt, free))
    heals = {"word": "    return fi", "line": "\n", "odd": "zq"}
    for name, heal in heals.items():
        params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, heal=heal)
        engine.add_request(EngineRequest(name, prompt, params))
    sampled = SamplingParams(max_tokens=16, temperature=0.8, seed=1, ignore_eos=True,
                             heal="    return fi")
    engine.add_request(EngineRequest("sampled", prompt, sampled))
    out = {}
    while engine.has_unfinished_requests():
        out.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
    spelled = {k: b"".join(pieces[t] or b"" for t in ids) for k, ids in out.items()}
    for name, heal in {**heals, "sampled": "    return fi"}.items():
        assert spelled[name].startswith(heal.encode()), (name, spelled[name])
    assert not spelled["free"].startswith(b"zq")  # the constraint, not the model, spelled it


def test_an_engine_refuses_healing_without_a_byte_level_vocabulary(tiny_long_dir):
    engine = Engine(EngineConfig(model=str(tiny_long_dir), dtype="float32", num_kv_blocks=64))
    engine.__dict__["healer"] = Healer([None] * engine.tokenizer.vocab_size)
    with pytest.raises(ValueError, match="byte-level"):
        engine.check(EngineRequest("h", [1, 2, 3], SamplingParams(heal="x")))
