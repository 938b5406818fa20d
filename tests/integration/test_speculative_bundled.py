"""Speculative decoding on the bundled model and real code: greedy outputs token-identical with
speculation on and off, for each proposer, in the exact configuration (fp32) and in the default plan
against itself; and the guesses were verified and partly kept (the speedup's source), not
skipped."""

import pytest
from engine_checks import FlatStepTimes
from test_determinism_bundled import real_code_prompts

from warmpath import LLM, SamplingParams

pytestmark = pytest.mark.slow

# Code that repeats itself (what the proposers feed on) beside code that does not, decoded together.
PROMPTS = [p + p.split("\n", 1)[0] + "\n" for p in real_code_prompts(6)]
GREEDY = SamplingParams(max_tokens=48, temperature=0)


def _outputs(llm: LLM) -> list[list[int]]:
    outs = llm.generate(PROMPTS, GREEDY)
    assert llm.engine.pool.num_free == llm.engine.pool.num_blocks
    return [o.token_ids for o in outs]


@pytest.mark.integration
@pytest.mark.parametrize("config", [{"dtype": "float32"}, {}], ids=["exact fp32", "default plan"])
def test_greedy_outputs_on_real_code_are_the_same_with_speculation_on_and_off(config):
    off = _outputs(LLM("smollm2", speculative_method="none", num_kv_blocks=1024, **config))
    for method in ("ngram", "suffix"):
        llm = LLM("smollm2", speculative_method=method, speculative_max_seqs=8, num_kv_blocks=1024,
                  **config)
        # verifying always pays: exactness is tested here
        llm.engine.speculator.decode_times = FlatStepTimes()
        assert _outputs(llm) == off, method
        spec = llm.engine.speculator
        assert 0 < spec.accepted <= spec.proposed, (method, spec.proposed, spec.accepted)
