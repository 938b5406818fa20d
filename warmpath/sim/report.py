"""What a simulated run says: hit rate, TTFT, decode stalls, preemptions, sessions resident before
the first preemption, pool use over time; tables, JSON, pictures."""

from __future__ import annotations

import math

from warmpath.client.outcome import CANCELLED, COMPLETED, DROPPED, SHOWN, censored_ttfts, goodput
from warmpath.config import SLO
from warmpath.sim.driver import Driver, SimRecord
from warmpath.stats import percentile

STALL_S = 1.0  # an inter-token gap this long is a visible stall in a streaming answer


def summarize(driver: Driver, wall_s: float) -> dict:
    recs: list[SimRecord] = list(driver.records.values())
    editor = [r for r in recs if r.kind == "editor"]
    agent = [r for r in recs if r.kind == "agent"]
    stats = [b.stats for b in driver.backends]
    queried, hit = sum(s["queried"] for s in stats), sum(s["hit"] for s in stats)
    tier_hit = sum(s.get("tier_hit", 0) for s in stats)
    gaps = [b - a for r in recs for a, b in zip(r.token_times, r.token_times[1:], strict=False)]
    out: dict = {
        "requests": len(recs), "editor_requests": len(editor), "agent_requests": len(agent),
        "prefix_hit_rate": (hit + tier_hit) / queried if queried else None,
        "tier_hit_rate": tier_hit / queried if queried else None,
        "preemptions": sum(s["preemptions"] for s in stats), "evictions": sum(s["evictions"]
                                                                              for s in stats),
        "first_preemption_s": driver.first_preemption,
        "itl_p50_s": percentile(gaps, 50) if gaps else None,
        "itl_p99_s": percentile(gaps, 99) if gaps else None, "decode_stalls": sum(g >= STALL_S
                                                                                  for g in gaps),
        "simulated_s": driver.now, "wall_s": wall_s
    }
    for kind, rs in (("editor", editor), ("agent", agent)):
        if not rs:
            continue
        outcomes = {
            o: sum(r.outcome == o for r in rs)
            for o in (SHOWN, DROPPED, CANCELLED, COMPLETED)
        }
        out[f"{kind}_outcomes"] = {k: v for k, v in outcomes.items() if v}
        ttfts = censored_ttfts(rs)
        out[f"{kind}_ttft_p50_s"] = percentile(ttfts, 50) if ttfts else None
        out[f"{kind}_ttft_p99_s"] = percentile(ttfts, 99) if ttfts else None
        out[f"{kind}_goodput"] = goodput(rs, getattr(SLO(), f"{kind}_ttft_s"))
    before = [s.resident_sessions for s in driver.samples
              if driver.first_preemption is None or s.t <= driver.first_preemption]
    out["max_resident_sessions_before_preemption"] = max(before, default=0)
    out["max_resident_sessions"] = max((s.resident_sessions for s in driver.samples), default=0)
    blocks = sum(b.pool.num_blocks for b in driver.backends)
    used = [s.used_blocks / blocks for s in driver.samples]
    out["pool_used_mean"] = sum(used) / len(used) if used else 0.0
    out["pool_used_max"] = max(used, default=0.0)
    out["pool_blocks"] = blocks
    return out


ROWS = [("prefix-cache hit rate (RAM + tier)", "prefix_hit_rate", "pct"),
        ("of which from the KV tier", "tier_hit_rate", "pct"),
        (f"editor goodput (TTFT <= {SLO.editor_ttft_s * 1000:.0f} ms)", "editor_goodput", "pct"),
        ("editor TTFT p50", "editor_ttft_p50_s", "s"),
        ("editor TTFT p99", "editor_ttft_p99_s", "s"), ("agent TTFT p50", "agent_ttft_p50_s", "s"),
        ("agent TTFT p99", "agent_ttft_p99_s", "s"), ("inter-token p50", "itl_p50_s", "s"),
        ("inter-token p99", "itl_p99_s", "s"),
        (f"decode stalls (gap >= {STALL_S:.0f} s)", "decode_stalls", "n"),
        ("preemptions", "preemptions", "n"), ("first preemption at", "first_preemption_s", "s"),
        ("max sessions resident before it", "max_resident_sessions_before_preemption", "n"),
        ("pool used, mean / max", "pool_used", "pool"), ("requests", "requests", "n"),
        ("simulated / wall time", "time", "time")]


def fmt(s: dict, key: str, unit: str) -> str:
    if unit == "pool":
        return (f"{100 * s['pool_used_mean']:.0f}% / {100 * s['pool_used_max']:.0f}% "
                f"of {s['pool_blocks']}")
    if unit == "time":
        return f"{s['simulated_s']:.0f} s / {s['wall_s']:.1f} s"
    v = s.get(key)
    if v is None:
        return "-"
    if unit == "pct":
        return f"{100 * v:.1f}%"
    if unit == "s":
        return "> deadline" if v == math.inf else (f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s")
    return f"{v:.0f}" if isinstance(v, (int, float)) else str(v)


def table(summaries: list[dict], names: list[str]) -> str:
    lines = ["| figure | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, key, unit in ROWS:
        if unit == "s" and all(s.get(key) is None for s in summaries):
            continue
        lines.append(f"| {label} | " + " | ".join(fmt(s, key, unit) for s in summaries) + " |")
    return "\n".join(lines)
