"""From request records (and the server's counters) to the figures that decide things: TTFT / TPOT /
ITL percentiles, goodput, shown / dropped / cancelled, wasted tokens, prefix-cache hit rate, a
quality proxy.

TTFT is censored as warmpath.client.outcome.censored_ttft says: a request dropped at the client
deadline counts as +inf (printed "> 300 ms"), never as the deadline itself; one cancelled stale
before its first token is left out of TTFT and goodput."""

from __future__ import annotations

import difflib
import math

from warmpath.bench.runner import RunResult
from warmpath.bench.scrape import delta
from warmpath.client.outcome import (
    CANCELLED,
    COMPLETED,
    DROPPED,
    ERROR,
    SHOWN,
    censored_ttfts,
    goodput,
)
from warmpath.config import SLO
from warmpath.stats import percentile

__all__ = ["PERCENTILES", "SLO", "fmt", "lookup", "percentile", "summarize", "table"]

PERCENTILES = (50, 90, 99)


def first_line(text: str) -> str:
    return text.lstrip("\n").split("\n")[0].rstrip()


def summarize(run: RunResult, slo: SLO) -> dict:
    recs = run.records
    editor = [r for r in recs if r.kind == "editor"]
    agent = [r for r in recs if r.kind == "agent"]
    out: dict = {
        "target": run.target, "model": run.model, "duration_s": round(run.duration_s, 2),
        "keystrokes": run.keystrokes, "requests": len(recs), "editor_requests": len(editor),
        "agent_requests": len(agent)
    }
    by = {
        o: sum(r.outcome == o for r in recs)
        for o in (SHOWN, DROPPED, CANCELLED, COMPLETED, ERROR)
    }
    out["outcomes"] = by
    if editor:
        n = len(editor)
        out["shown_rate"] = by[SHOWN] / n
        out["dropped_rate"] = sum(r.outcome == DROPPED for r in editor) / n
        out["cancelled_rate"] = sum(r.outcome == CANCELLED for r in editor) / n
    out["errors"] = [r.error for r in recs if r.outcome == ERROR][:5]

    for kind, rs, target in (("editor", editor, slo.editor_ttft_s), ("agent", agent,
                                                                     slo.agent_ttft_s)):
        if not rs:
            continue
        vals = censored_ttfts(rs)
        out[f"{kind}_ttft_s"] = {f"p{q}": percentile(vals, q) for q in PERCENTILES}
        out[f"{kind}_ttft_n"] = len(vals)
        share = goodput(rs, target)
        out[f"{kind}_goodput"] = math.nan if share is None else share
        out[f"{kind}_slo_ttft_s"] = target
    all_ttft = censored_ttfts(recs)
    out["ttft_s"] = {f"p{q}": percentile(all_ttft, q) for q in PERCENTILES}
    good = sum(1 for r in recs if r.ttft is not None and r.ttft <= (
        slo.editor_ttft_s if r.kind == "editor" else slo.agent_ttft_s))
    out["good_requests_per_s"] = good / run.duration_s if run.duration_s else math.nan

    tpot = [(r.chunk_times[-1] - r.first_token) / (r.tokens - 1) for r in recs
            if r.first_token is not None and r.tokens > 1 and len(r.chunk_times) > 1]
    itl = [b - a for r in recs for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False)]
    e2e = [r.done - r.sent for r in recs if r.done is not None and r.outcome in (SHOWN, COMPLETED)]
    out["tpot_s"] = {f"p{q}": percentile(tpot, q) for q in PERCENTILES}
    out["itl_s"] = {f"p{q}": percentile(itl, q) for q in PERCENTILES}
    out["e2e_s"] = {f"p{q}": percentile(e2e, q) for q in PERCENTILES}
    tokens = sum(r.tokens for r in recs)
    finished = sum(r.outcome in (SHOWN, COMPLETED) for r in recs)
    out["request_throughput"] = finished / run.duration_s if run.duration_s else math.nan
    out["token_throughput"] = tokens / run.duration_s if run.duration_s else math.nan

    d = delta(run.metrics_before, run.metrics_after)
    out["server"] = d
    out["wasted_tokens"] = d.get("wasted_tokens")
    if "typed_through" in d and recs:  # requests that typed into the last suggestion
        out["typed_through_share"] = d["typed_through"] / len(recs)
    if "short_context" in d and recs:
        out["short_context_share"] = d["short_context"] / len(recs)
    if d.get("prefix_queried_tokens"):
        # a prompt token not computed is a hit, whether the RAM pool held it or the KV tier gave it
        # back
        hits = d["prefix_hit_tokens"] + d.get("prefix_tier_hit_tokens", 0.0)
        out["prefix_hit_rate"] = hits / d["prefix_queried_tokens"]
        out["prefix_hit_rate_source"] = "server /metrics"
    else:
        withusage = [r for r in recs if r.prompt_tokens and r.cached_tokens is not None]
        if withusage:
            out["prefix_hit_rate"] = sum(r.cached_tokens
                                         for r in withusage) / sum(r.prompt_tokens
                                                                   for r in withusage)
            out["prefix_hit_rate_source"] = "usage.cached_tokens of completed requests"
        else:
            out["prefix_hit_rate"] = run.extra.get("prefix_hit_rate", math.nan)
            out["prefix_hit_rate_source"] = run.extra.get("prefix_hit_rate_source",
                                                          "not reported by the server")

    # What each answered prompt cost the server: its tokens not served from the prefix cache (its
    # usage). Only requests whose first token came: one dropped in the queue reports 0 cached
    # without computing anything.
    computed = [r.prompt_tokens - r.cached_tokens for r in recs
                if r.ttft is not None and r.prompt_tokens and r.cached_tokens is not None]
    out["computed_prompt_tokens"] = {f"p{q}": percentile(computed, q) for q in PERCENTILES}

    # Quality proxy over shown suggestions: first line equal to the real next line; edit similarity.
    judged = [r for r in editor if r.outcome == SHOWN and r.expected is not None]
    if judged:
        exact = [
            first_line(r.text) == r.expected.strip() or first_line(r.text) == r.expected.rstrip()
            for r in judged
        ]
        sims = [
            difflib.SequenceMatcher(None, first_line(r.text), r.expected.strip()).ratio()
            for r in judged
        ]
        out["quality_first_line_exact"] = sum(exact) / len(judged)
        out["quality_edit_similarity"] = sum(sims) / len(judged)
        out["quality_n"] = len(judged)
    return out


# -- table -----------------------------------------------------------------------------------------
ROWS = [  # label, summary path, unit, which way is better ("" = neither)
    ("requests sent", "requests", "n", ""),
    ("keystrokes", "keystrokes", "n", ""),
    ("editor TTFT p50", "editor_ttft_s.p50", "ms", "lower"),
    ("editor TTFT p90", "editor_ttft_s.p90", "ms", "lower"),
    ("editor TTFT p99", "editor_ttft_s.p99", "ms", "lower"),
    ("editor goodput (TTFT <= SLO)", "editor_goodput", "%", "higher"),
    ("agent TTFT p50", "agent_ttft_s.p50", "ms", "lower"),
    ("agent TTFT p99", "agent_ttft_s.p99", "ms", "lower"),
    ("agent goodput (TTFT <= SLO)", "agent_goodput", "%", "higher"),
    ("TPOT p50", "tpot_s.p50", "ms", "lower"),
    ("TPOT p99", "tpot_s.p99", "ms", "lower"),
    ("ITL p50", "itl_s.p50", "ms", "lower"),
    ("ITL p90", "itl_s.p90", "ms", "lower"),
    ("ITL p99", "itl_s.p99", "ms", "lower"),
    ("e2e p50", "e2e_s.p50", "ms", "lower"),
    ("e2e p99", "e2e_s.p99", "ms", "lower"),
    ("shown", "shown_rate", "%", "higher"),
    ("dropped (late)", "dropped_rate", "%", "lower"),
    ("cancelled (stale)", "cancelled_rate", "%", ""),
    ("good requests/s", "good_requests_per_s", "f", "higher"),
    ("requests/s answered", "request_throughput", "f", "higher"),
    ("tokens/s received", "token_throughput", "f", "higher"),
    ("wasted tokens (server)", "wasted_tokens", "n", "lower"),
    ("typed through a suggestion", "typed_through_share", "%", ""),
    ("answered from a short context", "short_context_share", "%", ""),
    ("prefix-cache hit rate", "prefix_hit_rate", "%", "higher"),
    ("prompt tokens computed p50", "computed_prompt_tokens.p50", "n", "lower"),
    ("prompt tokens computed p90", "computed_prompt_tokens.p90", "n", "lower"),
    ("quality: first line exact", "quality_first_line_exact", "%", "higher"),
    ("quality: edit similarity", "quality_edit_similarity", "f", "higher"),
]


def lookup(summary: dict, path: str):
    v = summary
    for part in path.split("."):
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    return v


def fmt(v, unit: str, deadline_ms: float | None = None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if unit == "ms":
        if math.isinf(v):
            return f"> {deadline_ms:.0f}" if deadline_ms else "inf"
        return f"{v * 1000:.0f}"
    if unit == "%":
        return f"{v * 100:.1f}%"
    if unit == "n":
        return f"{v:,.0f}"
    return f"{v:.3g}"


def table(summaries: list[dict], names: list[str], deadline_ms: float,
          markdown: bool = False) -> str:
    """Plain text for the terminal, or a Markdown table for the README."""
    header = ["figure"] + names + ([f"{names[0]} / {n}" for n in names[1:]]) + ["better"]
    rows = [header]
    for label, path, unit, better in ROWS:
        vals = [lookup(s, path) for s in summaries]
        if all(v is None for v in vals):
            continue
        unit_label = {"ms": " (ms)", "%": "", "n": "", "f": ""}[unit]
        row = [label + unit_label] + [fmt(v, unit, deadline_ms) for v in vals]
        for v in vals[1:]:
            a = vals[0]
            ok = all(isinstance(x, int | float) and math.isfinite(x) and x != 0 for x in (a, v))
            row.append(f"{a / v:.2f}x" if ok and unit != "n" else "-")
        rows.append(row + [better])
    if markdown:
        lines = ["| " + " | ".join(r) + " |" for r in rows]
        lines.insert(1, "|" + "|".join("---" for _ in header) + "|")
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        " | ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows
    ]
    lines.insert(1, "-|-".join("-" * w for w in widths))
    return "\n".join(lines)
