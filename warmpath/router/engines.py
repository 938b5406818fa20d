"""The engines a node may run, and what the router must know of each: how to tell it from the
others, how to read its load and prefix-cache counters from its own `/metrics`, and what its OpenAI
API accepts.

A node is named with its engine (`--node vllm=http://gpu1:8000`) or detected from its `/v1/models`
(`owned_by`) at its first passing health check. Every engine here answers `GET /health` with 200
when it takes requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class EngineKind:
    name: str
    # Gauges (summed over their label sets: one per model / engine core) that say how busy the node
    # is.
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_usage: tuple[str, ...]  # share of the KV cache in use, 0..1 (the first name found is read)
    # Prefix-cache counters in tokens, (queried, hit), each the sum of these counters: the fleet's
    # hit rate. None: the engine has none.
    prefix_counters: tuple[tuple[str, ...], tuple[str, ...]] | None
    # its /v1/completions takes `suffix`; else the router renders the FIM prompt itself
    accepts_suffix: bool
    # it stops at X-Deadline-Ms itself; else only the router's silence and close apply
    reads_deadline: bool
    # It aborts a request whose client went away whether or not it streams. llama-server does not
    # notice a closed connection of a non-streamed request while other requests (or /metrics
    # scrapes) keep it busy: such requests are streamed from it, and the router makes the whole
    # answer (translate.py).
    cancels_whole: bool = True
    # body fields the engine reads, set unless given
    hints: Mapping[str, object] = field(default_factory=dict)
    # the editor protocols (api/ modules) it speaks itself, besides OpenAI's
    wires: tuple[str, ...] = ()
    # It ends fill-in-the-middle answers where the code ends itself (api/scope.py); else the router
    # does.
    applies_scope: bool = False
    # How its completion can be made to begin with given text (router/healing.py): "grammar"
    # (llama.cpp's GBNF), "structured_outputs" (vLLM's regex), "regex" (SGLang's); None: it cannot,
    # so the router does not heal.
    start_constraint: str | None = None


ENGINES = {
    "warmpath": EngineKind("warmpath", ("warmpath_num_requests_running", ),
                           ("warmpath_num_requests_waiting", ), ("warmpath_kv_cache_usage_ratio", ),
                           (("warmpath_prefix_cache_queried_tokens_total", ),
                            ("warmpath_prefix_cache_hit_tokens_total", )), accepts_suffix=True,
                           reads_deadline=True, wires=("infill", "ollama", "mistral", "tabby"),
                           applies_scope=True),
    "vllm": EngineKind(
        "vllm",
        ("vllm:num_requests_running", ),
        ("vllm:num_requests_waiting", ),
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),  # the second: releases before V1
        (("vllm:prefix_cache_queries_total", ), ("vllm:prefix_cache_hits_total", )),
        accepts_suffix=False,
        reads_deadline=False,
        start_constraint="structured_outputs"),
    # Cached tokens are counted inside its prompt tokens (sglang:cache_hit_rate is the last batch's
    # only).
    "sglang": EngineKind("sglang", ("sglang:num_running_reqs", ), ("sglang:num_queue_reqs", ),
                         ("sglang:token_usage", ),
                         (("sglang:prompt_tokens_total", ), ("sglang:cached_tokens_total", )),
                         accepts_suffix=False, reads_deadline=False, start_constraint="regex"),
    # llama-server keeps a slot's KV for the next request only when asked (cache_prompt: the default
    # in recent versions, said explicitly for older ones). Its prompt-token counter excludes the
    # cached ones; no KV gauge. Its /v1/completions ignores `suffix`, and its /infill refuses a
    # model without FIM tokens (501): the router renders FIM and translates /infill itself, by the
    # model's name, as for vLLM.
    "llamacpp": EngineKind("llamacpp", ("llamacpp:requests_processing", ),
                           ("llamacpp:requests_deferred", ), (),
                           (("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"),
                            ("llamacpp:prompt_tokens_cached_total", )), accepts_suffix=False,
                           reads_deadline=False, hints={"cache_prompt": True}, cancels_whole=False,
                           start_constraint="grammar"),
    # Any other OpenAI-compatible server: no load signal but the router's own count, no suffix.
    "openai": EngineKind("openai", (), (), (), None, accepts_suffix=False, reads_deadline=False),
}
OWNED_BY = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llamacpp", "warmpath": "warmpath"}


def split_spec(spec: str) -> tuple[str | None, str]:
    """`vllm=http://h:8000` -> ("vllm", "http://h:8000"); a bare URL -> (None, URL): detected
    later."""
    kind, sep, url = spec.partition("=")
    if sep and kind in ENGINES and "://" not in kind:
        return kind, url
    if sep and "://" not in kind:
        raise ValueError(f"unknown engine {kind!r} in {spec!r}: one of {', '.join(ENGINES)}")
    return None, spec


def detect(models_body: object) -> str:
    """The engine behind a node, from its `/v1/models` answer (each engine names itself in
    `owned_by`)."""
    data = models_body.get("data") if isinstance(models_body, dict) else None
    for card in data if isinstance(data, list) else []:
        owner = card.get("owned_by") if isinstance(card, dict) else None
        if owner in OWNED_BY:
            return OWNED_BY[owner]
    return "openai"


@dataclass
class NodeLoad:
    """What a node's own /metrics said at the last scrape."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    # "queried" / "hit" prefix-cache tokens
    counters: dict[str, float] = field(default_factory=dict)

    @property
    def requests(self) -> float:
        return self.running + self.waiting


def read_load(engine: EngineKind, text: str) -> NodeLoad:
    """A node's load and prefix counters from its Prometheus text; ValueError if the text does not
    parse."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name] = samples.get(s.name, 0.0) + s.value
    load = NodeLoad(sum(samples.get(n, 0.0) for n in engine.running),
                    sum(samples.get(n, 0.0) for n in engine.waiting),
                    next((samples[n] for n in engine.kv_usage if n in samples), 0.0))
    if engine.prefix_counters and all(n in samples for names in engine.prefix_counters
                                      for n in names):
        queried, hit = engine.prefix_counters
        load.counters = {
            "queried": sum(samples[n] for n in queried), "hit": sum(samples[n] for n in hit)
        }
    return load
