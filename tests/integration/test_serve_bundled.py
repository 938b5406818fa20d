"""`warmpath serve` as a user runs it (a subprocess, the bundled model, a real port), driven by the
official openai client: completion, streaming, chat with the model's own chat template, sessions."""

import httpx
import openai
import pytest
from server_harness import serve_process

from warmpath import SamplingParams

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def served():
    with serve_process("--model", "smollm2", "--dtype", "float32") as (url, _):
        yield url


def test_openai_client_against_warmpath_serve(served, smollm2_fp32):
    c = openai.OpenAI(base_url=f"{served}/v1", api_key="unused", max_retries=0)
    assert c.models.list().data[0].id == "smollm2"
    prompt = "def fibonacci(n):\n"
    expected = smollm2_fp32.generate(prompt, SamplingParams(max_tokens=24, temperature=0))[0].text
    r = c.completions.create(model="smollm2", prompt=prompt, max_tokens=24, temperature=0)
    assert r.choices[0].text == expected
    stream = c.completions.create(model="smollm2", prompt=prompt, max_tokens=24, temperature=0,
                                  stream=True)
    assert "".join(ch.choices[0].text for ch in stream if ch.choices) == expected
    chat = c.chat.completions.create(
        model="smollm2", temperature=0, max_tokens=16,
        messages=[{"role": "user", "content": "What does `len` do in Python?"}])
    # ChatML with SmolLM2's default system prompt, rendered from the GGUF's own template.
    assert chat.usage.prompt_tokens > 20 and chat.choices[0].message.content.strip()
    assert chat.choices[0].finish_reason in ("stop", "length")


def test_session_prompt_growth_is_cached(served):
    prompt = open(__file__).read()[:3000]
    last = None
    with httpx.Client(timeout=120) as http:
        for turn in range(3):
            u = http.post(f"{served}/v1/completions", headers={"X-Session-Id": "alice"},
                          json={"prompt": prompt, "max_tokens": 4,
                                "temperature": 0}).json()["usage"]
            if last is not None:
                assert u["prompt_tokens_details"]["cached_tokens"] >= last - 16
            last = u["prompt_tokens"]
            prompt += f"\n# turn {turn}: the cursor moved on\n"
