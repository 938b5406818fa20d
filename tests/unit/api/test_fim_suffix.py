"""The FIM suffix a prompt keeps (api/fim.py keep_suffix, suffix_budget): its first whole lines, as
many tokens as the machine computes in 250 ms (64 at least), measured once per machine and model.
Moving the anchor or opening a file computes the suffix again before the first token, so its length
is what such a keystroke waits for; the cut depends on the suffix's text and the budget alone, so
typing before it never moves it (the kept suffix stays in the prefix cache), and the answer's scope
still reads the whole suffix."""

import json
import threading
from pathlib import Path

import httpx
import pytest
from gguf import GGMLQuantizationType as Q
from server_harness import running_server
from tiny_gguf import QWEN_VOCAB, uniform, write_gguf

from warmpath.api.fim import (
    MIN_SUFFIX_TOKENS,
    SUFFIX_MS,
    Fill,
    FimFormat,
    detect_fim,
    keep_suffix,
    suffix_budget,
    suffix_tokens,
)
from warmpath.config import EngineConfig, ServerConfig
from warmpath.engine.plan import BackendPlan
from warmpath.engine.plan_timing import prompt_speed, prompt_speed_path

DATA = Path(__file__).parents[2] / "data"
WORDS = lambda text: len(text.split()) + 1  # noqa: E731  (a token per word and one per line)
SUFFIX = "x)\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n\n\nprint(add(1, 2))\n"


def test_the_first_whole_lines_that_fit_and_the_cursor_line_always():
    lines = SUFFIX.splitlines(keepends=True)
    costs = [WORDS(line) for line in lines]
    for budget in range(0, sum(costs) + 2):
        kept = keep_suffix(SUFFIX, budget, WORDS)
        n = len(kept.splitlines(keepends=True))
        # whole lines, the cursor's line always
        assert SUFFIX.startswith(kept) and kept.endswith("\n") and n >= 1
        assert n == 1 or sum(costs[:n]) <= budget  # within the budget (beyond the cursor's line)
        assert n == len(lines) or sum(costs[:n + 1]) > budget  # and as many as fit
    assert keep_suffix(SUFFIX, 10_000, WORDS) == SUFFIX
    # one line: always kept
    assert keep_suffix("", 8, WORDS) == "" and keep_suffix("abc", 0, WORDS) == "abc"


# Seconds per prompt token recorded on the project's machines, and the budget each gets: what it
# computes in SUFFIX_MS, whole 16-token blocks of it, MIN_SUFFIX_TOKENS at least (fewer cost
# pass@1).
MEASURED = {
    "AVX2 EPYC, Qwen2.5-Coder-0.5B (StepCost.prompt_seconds_per_token, 2026-12-05)": (0.00307, 80),
    "AVX2 EPYC, Qwen2.5-Coder-1.5B (StepCost.prompt_seconds_per_token, 2026-12-05)": (0.00948, 64),
    "AVX2 EPYC, SmolLM2-135M (StepCost.prompt_seconds_per_token, 2026-12-05)": (0.00085, 288),
    "Zen 4, Qwen2.5-Coder-0.5B (anchors.md: cold 2,000 tokens in 5.21 s)": (5.21 / 2000, 80),
    "Zen 4, Qwen2.5-Coder-1.5B (anchors.md: cold 2,000 tokens in 12.65 s)": (12.65 / 2000, 64),
    **{
        f"{cpu}, SmolLM2-135M (tests/data/plan_timings_{name}.json: native-int8, 128 new tokens)":
            (json.loads((DATA / f"plan_timings_{name}.json").read_text())
             ["backends"]["native-int8"]["chunk"]["128@0"] / 1000 / 128, expected)
        for cpu, name, expected in (("Sapphire Rapids", "spr", 368),
                                    ("Emerald Rapids without AMX", "emr", 336))
    },
}


@pytest.mark.parametrize("machine", sorted(MEASURED))
def test_the_budget_is_what_the_machine_computes_in_the_target(machine):
    seconds, expected = MEASURED[machine]
    budget = suffix_budget(seconds)
    assert budget == expected and budget % 16 == 0
    assert budget * seconds <= SUFFIX_MS / 1000 or budget == MIN_SUFFIX_TOKENS
    assert suffix_tokens("auto", seconds) == budget
    assert suffix_tokens("all", seconds) is None and suffix_tokens("40", seconds) == 40
    with pytest.raises(ValueError):
        suffix_tokens("lots", seconds)


@pytest.fixture(scope="module")
def qwen_model(tmp_path_factory):
    path, _, _ = write_gguf(
        tmp_path_factory.mktemp("fim-suffix") / "qwen.gguf", "qwen2", uniform(Q.Q8_0), QWEN_VOCAB)
    return path


def complete(url, **body) -> dict:
    r = httpx.post(f"{url}/v1/completions", json={"max_tokens": 4, "temperature": 0, **body},
                   timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.server
@pytest.mark.parametrize("setting", ["24", "all"])
def test_the_server_keeps_the_suffix_lines_that_fit_and_caches_them_along_the_file(
        qwen_model, setting):
    """Through `warmpath serve`: the prompt is the anchored layout of the prefix and the suffix's
    lines that fit --fim-suffix-tokens (all of it with "all"), the answer's scope reading the whole
    suffix; the next keystroke finds the kept suffix in the prefix cache."""
    config = EngineConfig(model=str(qwen_model), dtype="float32", num_kv_blocks=256)
    with running_server(config, ServerConfig(fim_suffix_tokens=setting)) as (url, app):
        tok = app.state.engine.tokenizer
        fim = detect_fim(tok)
        prefix, suffix = "import os\n\n\ndef add(a, b):\n    return a +", "\n" + SUFFIX * 6
        budget = None if setting == "all" else int(setting)
        kept = suffix if budget is None else keep_suffix(
            suffix, budget, lambda t: len(tok.encode(t, add_bos=False)))
        assert (kept == suffix) == (budget is None) and len(kept) > 1
        count = lambda t: len(tok.encode(t, add_bos=False))  # noqa: E731
        rendered = FimFormat(fim, "anchored", budget, count, tok).render(Fill(prefix, suffix))
        assert rendered.text == fim.build(prefix, kept,
                                          layout="anchored") and rendered.cursor == (prefix, suffix)
        first = complete(url, prompt=prefix, suffix=suffix)
        assert first["usage"]["prompt_tokens"] == len(
            tok.encode(fim.build(prefix, kept, layout="anchored"))) - 1
        card = httpx.get(f"{url}/v1/models").json()["data"][0]
        assert card["fim_suffix_tokens"] == budget
        before_middle = tok.encode(
            fim.build(prefix, kept, layout="anchored").split(fim.tokens[-1])[0])
        typed = complete(url, prompt=prefix + " b", suffix=suffix)
        assert typed["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(
            before_middle) // 16 * 16


@pytest.mark.server
def test_auto_is_the_measured_speeds_budget(qwen_model):
    config = EngineConfig(model=str(qwen_model), dtype="float32", num_kv_blocks=256)
    with running_server(config, ServerConfig(fim_suffix_tokens="auto")) as (url, app):
        engine = app.state.engine
        measured = engine.cost.prompt_seconds_per_token
        assert 0 < measured < 0.1
        # the scheduler's first step, the same figure
        assert engine.cost.per_token == pytest.approx(measured)
        card = httpx.get(f"{url}/v1/models").json()["data"][0]
        assert card["fim_suffix_tokens"] == suffix_budget(measured)


def test_the_prompt_speed_is_measured_once_per_machine_model_and_code(tmp_path, monkeypatch):
    """Kept beside the measured plan (its key names the machine, model and code): every later start
    reads the same figure, so the same request gets the same prompt; a fixed plan (no key) is
    measured at every start."""
    monkeypatch.setenv("WARMPATH_HOME", str(tmp_path))
    measured = []

    def measure() -> float:
        measured.append(1)
        return 0.003 + len(measured) / 1000

    plan = BackendPlan("native-int8", None, {}, {}, key="cpu-model-code")
    assert prompt_speed(plan, "native-int8, bfloat16 KV, cpu", measure) == 0.004
    assert prompt_speed(plan, "native-int8, bfloat16 KV, cpu",
                        measure) == 0.004 and len(measured) == 1
    # another route: its own figure
    assert prompt_speed(plan, "native-int8, int8 KV, cpu", measure) == 0.005
    assert json.loads(prompt_speed_path(plan.key).read_text()) == {
        "native-int8, bfloat16 KV, cpu": 0.004, "native-int8, int8 KV, cpu": 0.005
    }
    prompt_speed_path(plan.key).write_text("{half a fi")  # unreadable: measured again
    assert prompt_speed(plan, "native-int8, bfloat16 KV, cpu", measure) == 0.006
    fixed = BackendPlan("native-int8", None, {}, {})
    assert prompt_speed(fixed, "x", measure) == 0.007 and prompt_speed(fixed, "x", measure) == 0.008


def test_engines_starting_together_keep_each_others_prompt_speed(tmp_path, monkeypatch):
    """Two starts on one home measure different routes at the same moment: the file keeps both
    figures, so a third start on either route measures nothing and writes nothing."""
    monkeypatch.setenv("WARMPATH_HOME", str(tmp_path))
    plan = BackendPlan("native-int8", None, {}, {}, key="cpu-model-code")
    first_measuring, second_measuring = threading.Event(), threading.Event()

    def first() -> float:
        first_measuring.set()
        second_measuring.wait(0.5)  # measured at once unless the second start waits its turn
        return 0.004

    def second() -> float:
        second_measuring.set()
        return 0.005

    a = threading.Thread(target=prompt_speed, args=(plan, "native-int8, bfloat16 KV", first))
    a.start()
    assert first_measuring.wait(10)
    assert prompt_speed(plan, "native-int8-bf16attn, bfloat16 KV", second) == 0.005
    a.join()
    assert json.loads(prompt_speed_path(plan.key).read_text()) == {
        "native-int8, bfloat16 KV": 0.004, "native-int8-bf16attn, bfloat16 KV": 0.005}
