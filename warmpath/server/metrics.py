"""Prometheus metrics for the engine and the server, prefix `warmpath_`.

Engine counters and gauges are read at scrape time from the stats the step thread last published
(AsyncEngine.snapshot: Engine.stats(), one source of truth); latency
histograms and per-reason abort counts are observed by the server as requests finish.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from warmpath.engine.heap import free_heap_bytes, used_heap_bytes

disable_created_metrics()  # no *_created series: they double the scrape for nothing we use

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], dict]):
        self.stats = stats

    def collect(self):
        s = self.stats()
        for name, key, doc in (
            ("prefix_cache_queried_tokens", "prefix_cache_queried_tokens",
             "Prompt tokens looked up in the prefix cache"),
            ("prefix_cache_hit_tokens", "prefix_cache_hit_tokens",
             "Prompt tokens served from the prefix cache "
             "in RAM"),
            ("prefix_cache_tier_hit_tokens", "prefix_cache_tier_hit_tokens",
             "Prompt tokens read back from the KV "
             "tier on disk instead of computed"),
            ("kv_tier_rejected_blocks", "kv_tier_rejected",
             "KV tier files found corrupt, truncated or foreign: "
             "deleted, their tokens recomputed"),
            ("kv_tier_write_errors", "kv_tier_write_errors",
             "KV tier blocks that could not be written (a full "
             "disk): kept in RAM only"),
            ("kv_tier_dropped_blocks", "kv_tier_dropped",
             "KV tier blocks not kept: the write queue was full "
             "(--kv-offload-queue-bytes; a slow disk)"),
            ("kv_tier_evicted_blocks", "kv_tier_evicted",
             "KV tier block files deleted to keep the tier directory "
             "within --kv-offload-bytes (any key's, any server's)"),
            ("kv_tier_stale_keys_pruned", "kv_tier_stale_keys_pruned",
             "KV tier key directories no server used "
             "(an old model, plan or code version), removed to make room"),
            ("preemptions", "num_preemptions",
             "Requests preempted (recomputed) for lack of KV blocks"),
            ("kv_cache_evictions", "num_evictions", "Cached KV blocks evicted (LRU)"),
            ("computed_tokens", "num_computed_tokens", "Tokens run through the model"),
            ("heap_trims", "heap_trims",
             "Times the idle engine gave the heap's free pages back to the OS"),
            ("heap_released_bytes", "heap_released_bytes", "Resident bytes those trims gave back"),
        ):
            c = CounterMetricFamily(f"warmpath_{name}", doc)
            c.add_metric([], s[key])
            yield c
        for name, key, doc in (
            ("spec_draft_tokens", "spec_draft_tokens", "Speculative guesses verified"),
            ("spec_accepted_tokens", "spec_accepted_tokens",
             "Speculative guesses kept (the model sampled them)"),
        ):
            c = CounterMetricFamily(f"warmpath_{name}", doc, labels=["method"])
            c.add_metric([s["spec_method"]], s[key])
            yield c
        c = CounterMetricFamily(
            "warmpath_warm_ups_dropped", "Warm-ups of late or refused prompts dropped for a "
            "bound on their queued tokens (--warm-up-tokens-per-tenant, --warm-up-tokens)",
            labels=["bound"])
        c.add_metric(["tenant"], s["warm_ups_dropped_tenant"])
        c.add_metric(["total"], s["warm_ups_dropped_total"])
        yield c
        for name, value, doc in (
            ("num_requests_running", s["num_running"], "Requests holding KV blocks"),
            ("num_requests_waiting", s["num_waiting"], "Requests queued (new or preempted)"),
            ("kv_cache_usage_ratio", s["used_blocks"] / s["num_blocks"],
             "Share of KV blocks held by requests"),
            ("kv_cache_cached_blocks", s["cached_blocks"], "Blocks holding a reusable prefix"),
            ("kv_cache_blocks", s["num_blocks"], "KV blocks in the pool"),
            ("kv_cache_bytes", s["kv_cache_bytes"], "Bytes of the KV cache"),
            ("kv_tier_blocks", s["kv_tier_blocks"], "KV blocks kept in the disk tier"),
            ("kv_tier_bytes", s["kv_tier_bytes"], "Bytes of the disk tier's files"),
            ("kv_tier_queued_bytes", s["kv_tier_queued_bytes"],
             "Bytes of KV blocks waiting for the tier's writer"),
            ("warm_up_tokens", s["warm_up_tokens"],
             "Prompt tokens of warm-ups waiting for an idle step"),
            ("weight_bytes", s["weight_bytes"],
             "Bytes of resident weights (every form a backend of the plan reads)"),
            ("kv_cache_warm_sessions_4k", s["num_blocks"] * s["block_size"] / 4096,
             "4k-token sessions the KV pool holds at once"),
            ("heap_used_bytes", used_heap_bytes(),
             "Bytes the process's malloc has handed out (glibc; 0 elsewhere)"),
            ("heap_free_bytes", free_heap_bytes(),
             "Bytes free inside malloc's heap, resident until trimmed"),
        ):
            g = GaugeMetricFamily(f"warmpath_{name}", doc)
            g.add_metric([], value)
            yield g


class Metrics:
    def __init__(self, stats: Callable[[], dict]):
        """stats: Engine.stats() as the step thread last published it (or the engine's own, with no
        step thread)."""
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(stats))
        r = self.registry
        self.ttft = Histogram("warmpath_time_to_first_token_seconds", "Time to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("warmpath_time_per_output_token_seconds",
                              "Time per output token after the first",
                              buckets=(0.005, 0.01, 0.02, 0.04, 0.06, 0.1, 0.2, 0.5, 1.0, 2.5),
                              registry=r)
        self.e2e = Histogram("warmpath_e2e_request_latency_seconds", "Receipt to last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("warmpath_prompt_tokens", "Prompt tokens received", registry=r)
        self.generation_tokens = Counter("warmpath_generation_tokens", "Tokens generated",
                                         registry=r)
        self.wasted_tokens = Counter(
            "warmpath_wasted_tokens", "Tokens generated for requests nobody saw the end of "
            "(client gone, or past the deadline)", registry=r)
        self.requests = Counter("warmpath_requests", "Requests answered, by finish reason",
                                ["finish_reason"], registry=r)
        self.aborted = Counter("warmpath_requests_aborted", "Requests ended early, by reason",
                               ["reason"], registry=r)
        for reason in ("client", "deadline", "overloaded", "low_confidence"):
            self.aborted.labels(reason)
        self.typed_through = Counter("warmpath_typed_through", "Requests answered with the rest "
                                     "of their session's last answer, which the developer typed "
                                     "into (no model step)", registry=r)
        self.warm_ups_asked = Counter("warmpath_warm_ups_asked", "Clients' own warm-ups "
                                      "(/infill's n_predict 0, max_tokens 0) queued for idle "
                                      "steps", registry=r)
        self.short_context = Counter(
            "warmpath_short_context_answers", "FIM requests answered from their short context: "
            "their whole prompt, mostly uncached, could not answer within --first-token-ms (it "
            "warms on for the next keystroke), or --short-context always", registry=r)
        self.session_ids_hashed = Counter(
            "warmpath_session_ids_hashed", "Requests whose session id was longer "
            "than --max-session-id-chars: kept as its hash", registry=r)
        self.scope_cuts = Counter(
            "warmpath_completion_scope_cuts", "Fill-in-the-middle answers ended by the "
            "completion scope, by rule (api/scope.py)", ["rule"], registry=r)
        for rule in ("line", "suffix", "dedent", "statement", "repeat", "gap", "body"):
            # api/scope.py RULES
            self.scope_cuts.labels(rule)

    def render(self) -> bytes:
        return generate_latest(self.registry)
