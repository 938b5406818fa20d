"""Runs llama-cpp-python's OpenAI-compatible server (inside its own venv, see llama_cpp_python.py)
with one addition for `warmpath bench`: a `/metrics` route counting the prompt tokens it was asked
for and those it reused from its KV state (its prefix-match and RAM cache), measured where llama.cpp
decides them. The server itself is unchanged; arguments are llama_cpp.server's own."""

import threading

import llama_cpp.server.__main__ as entry
from fastapi.responses import PlainTextResponse
from llama_cpp import Llama

STATS = {"queried": 0, "hit": 0}
LOCK = threading.Lock()
_generate = Llama.generate


def generate(self, tokens, *args, **kwargs):
    """Count what Llama.generate will reuse, by its own rule: the longest common prefix with the
    tokens in its context, less one when the whole prompt matched (it re-evaluates the last token
    for fresh logits)."""
    tokens = list(tokens)
    reuse = 0
    if kwargs.get("reset", True) and self.n_tokens > 0:
        for a, b in zip(self._input_ids, tokens, strict=False):
            if a != b:
                break
            reuse += 1
        if reuse == len(tokens):
            reuse -= 1
    with LOCK:
        STATS["queried"] += len(tokens)
        STATS["hit"] += max(0, reuse)
    yield from _generate(self, tokens, *args, **kwargs)


Llama.generate = generate
_create_app = entry.create_app


def create_app(*args, **kwargs):
    app = _create_app(*args, **kwargs)

    @app.get("/metrics")
    def metrics():
        with LOCK:
            q, h = STATS["queried"], STATS["hit"]
        return PlainTextResponse(
            "# TYPE llamacpp_prefix_cache_queried_tokens counter\n"
            f"llamacpp_prefix_cache_queried_tokens_total {q}\n"
            "# TYPE llamacpp_prefix_cache_hit_tokens counter\n"
            f"llamacpp_prefix_cache_hit_tokens_total {h}\n")

    return app


entry.create_app = create_app

if __name__ == "__main__":
    entry.main()
