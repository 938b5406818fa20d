"""transformers (Hugging Face) as a baseline: the model read from the same GGUF file, in warmpath's
own venv (`make setup` installs transformers), timed in this process. Offline only: transformers
ships no OpenAI-compatible server, so serve_cmd() raises, and install() has nothing to do.

Prefill = one forward keeping only the last logits (no KV cache: no warm rows); decode = tokens/s of
one greedy stream, `generate` timed for DECODE_TOKENS + 1 tokens less the time of its first.
"""

from __future__ import annotations

import importlib.util
import statistics
import time

from baselines import DECODE_TOKENS, baseline_dtype


def install() -> None:
    """Nothing to install: transformers comes with warmpath's venv."""


def installed() -> bool:
    return importlib.util.find_spec("transformers") is not None


def serve_cmd(model: str, port: int, threads: int, **opts) -> tuple[list[str], dict[str, str]]:
    raise NotImplementedError(
        "transformers has no OpenAI-compatible server: it is an offline baseline only "
        "(baselines.transformers_hf.offline)")


class Transformers:
    name = "transformers"

    def __init__(self, dtype: str, model: str = "smollm2"):
        import torch
        import transformers

        from warmpath.models.registry import resolve_model

        path = resolve_model(model)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=getattr(torch, dtype)
        ).eval()

    def prefill(self, ids: list[int]) -> float:
        import torch

        with torch.inference_mode():
            t = time.perf_counter()
            logits = self.model(torch.tensor([ids]), logits_to_keep=1, use_cache=False).logits
            logits[0, -1].argmax().item()
            return time.perf_counter() - t

    def decode_tps(self, ids: list[int], tokens: int = DECODE_TOKENS) -> float:
        import torch

        with torch.inference_mode():
            x = torch.tensor([ids])
            t = time.perf_counter()
            self.model.generate(x, max_new_tokens=1, do_sample=False)
            first = time.perf_counter() - t
            t = time.perf_counter()
            out = self.model.generate(x, max_new_tokens=tokens + 1, min_new_tokens=tokens + 1,
                                      do_sample=False)
            total = time.perf_counter() - t
            assert out.shape[1] - x.shape[1] == tokens + 1
            return tokens / (total - first)


def offline(job: dict, model: str, threads: int, dtype: str | None = None) -> dict:
    """compare_cpu.py's rows in this process (torch at `threads` threads), at dtype
    (baseline_dtype() unless given)."""
    import torch

    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    t = Transformers(dtype or baseline_dtype(), model)
    t.prefill(job["warmup"])
    out = {
        f"prefill_{n}_s": statistics.median(t.prefill(ids) for ids in w)
        for n, w in job["prefill"].items()
    }
    out["warm_ttft_s"] = None  # no prefix cache
    out["decode_tps"] = statistics.median(t.decode_tps(ids, job.get("decode_tokens", DECODE_TOKENS))
                                          for ids in job["decode"])
    return out
