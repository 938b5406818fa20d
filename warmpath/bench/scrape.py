"""Server-side counters from `/metrics` (Prometheus text), read before and after a run.

warmpath's own names first; vLLM's where a vLLM server is the target; `llamacpp_*` from the
llama.cpp baseline launcher (benchmarks/baselines/llama_cpp_launch.py). A server with no `/metrics`
gives None, and the report falls back to what responses said (`usage.cached_tokens`)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from warmpath.client.completion import Target

# figure -> the sample names that carry it, by server
COUNTERS = {
    "prefix_queried_tokens": ("warmpath_prefix_cache_queried_tokens_total",
                              "vllm:prefix_cache_queries_total",
                              "llamacpp_prefix_cache_queried_tokens_total"),
    "prefix_hit_tokens": ("warmpath_prefix_cache_hit_tokens_total", "vllm:prefix_cache_hits_total",
                          "llamacpp_prefix_cache_hit_tokens_total"),
    "prefix_tier_hit_tokens": (
        "warmpath_prefix_cache_tier_hit_tokens_total", ),  # read back from warmpath's KV tier
    "wasted_tokens": ("warmpath_wasted_tokens_total", ),
    "generation_tokens": ("warmpath_generation_tokens_total", "vllm:generation_tokens_total"),
    "preemptions": ("warmpath_preemptions_total", "vllm:num_preemptions_total"),
    "evictions": ("warmpath_kv_cache_evictions_total", ),
    # answered with the rest of the last answer (server/type_through.py)
    "typed_through": ("warmpath_typed_through_total", ),
    # answered from a cold file's short context (engine/scheduler/_short_context.py)
    "short_context": ("warmpath_short_context_answers_total", ),
}
LABELLED = {
    "aborted_client": ("warmpath_requests_aborted_total", "reason", "client"),
    "aborted_deadline": ("warmpath_requests_aborted_total", "reason", "deadline"),
    "overloaded": ("warmpath_requests_aborted_total", "reason", "overloaded"),
    "finished_stop": ("warmpath_requests_total", "finish_reason", "stop"),
    "finished_length": ("warmpath_requests_total", "finish_reason", "length"),
}


def parse(text: str) -> dict[str, float]:
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name + "".join(f"|{k}={v}" for k, v in sorted(s.labels.items()))
            samples[key] = samples.get(key, 0.0) + s.value
    return samples


def figures(samples: dict[str, float]) -> dict[str, float]:
    out = {}
    for figure, names in COUNTERS.items():
        for name in names:
            if name in samples:
                out[figure] = samples[name]
                break
    for figure, (name, label, value) in LABELLED.items():
        key = f"{name}|{label}={value}"
        if key in samples:
            out[figure] = samples[key]
    return out


async def scrape(http: httpx.AsyncClient, target: Target) -> dict[str, float] | None:
    try:
        r = await http.get(target.root + "/metrics", headers=target.headers(), timeout=10)
        if r.status_code != 200:
            return None
        return figures(parse(r.text))
    except (httpx.HTTPError, ValueError):
        return None


def delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    if not before or not after:
        return {}
    return {k: after[k] - before.get(k, 0.0) for k in after}
