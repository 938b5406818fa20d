"""What a fleet run says: goodput and TTFT, hit rate, how often the router replicas agree, what a
node's loss cost (the sessions it moved, their cold prefills, the hit-rate dip), and the router's
own CPU per request."""

from __future__ import annotations

import math
import statistics

from warmpath.client.outcome import goodput
from warmpath.config import SLO
from warmpath.sim.capacity import router_cost
from warmpath.sim.fleet import FleetDriver
from warmpath.sim.report import summarize
from warmpath.stats import percentile

DIP_WINDOW_S = 60.0  # the hit rate before and after a node's loss, over this long each side
BUCKET_S = 10.0  # the timeline's resolution
COLD = 0.5  # a prefill that found less than this share of its prompt cached counts as cold


def _hit(recs) -> float | None:
    seen = [r for r in recs if r.cached_tokens is not None and r.prompt_tokens]
    total = sum(r.prompt_tokens for r in seen)
    return sum(min(r.cached_tokens, r.prompt_tokens) for r in seen) / total if total else None


def node_loss(driver: FleetDriver) -> dict | None:
    k = driver.kill
    if k is None:
        return None
    recs = sorted(driver.records.values(), key=lambda r: r.sent)
    first_after: dict[str, object] = {}
    for r in recs:
        if r.sent >= k.at and r.session not in first_after:
            first_after[r.session] = r
    homed = [first_after[s] for s in k.sessions_homed if s in first_after]
    cold = [
        r for r in homed if r.cached_tokens is not None and r.cached_tokens < COLD * r.prompt_tokens
    ]
    others = [
        r for s, r in first_after.items()
        if s in k.homes and k.homes[s] != k.node and r.node != k.homes[s]
    ]
    before = [r for r in recs if k.at - DIP_WINDOW_S <= r.sent < k.at]
    after = [r for r in recs if k.at <= r.sent < k.at + DIP_WINDOW_S]
    return {
        "node": driver.names[k.node], "at_s": k.at, "sessions_homed": len(k.sessions_homed),
        "sessions_homed_returning": len(homed), "in_flight": k.in_flight,
        "failed_over": k.failed_over, "cut_streams": k.cut_streams, "lost": k.lost,
        "cold_prefills": len(cold), "cold_prefill_tokens": sum(r.prompt_tokens - r.cached_tokens
                                                               for r in cold),
        "other_sessions_moved": len(others), "window_s": DIP_WINDOW_S,
        "hit_rate_before": _hit(before), "hit_rate_after": _hit(after),
        "homed_hit_rate_after": _hit(homed)
    }


def timeline(driver: FleetDriver, target_s: float) -> list[dict]:
    buckets: dict[int, list] = {}
    for r in driver.records.values():
        buckets.setdefault(int(r.sent // BUCKET_S), []).append(r)
    return [{"t": b * BUCKET_S, "requests": len(rs), "hit_rate": _hit(rs),
             "editor_goodput": goodput([r for r in rs if r.kind == "editor"], target_s)}
            for b, rs in sorted(buckets.items())]


def request_rate(driver: FleetDriver) -> dict:
    per_s: dict[int, int] = {}
    for r in driver.records.values():
        per_s[int(r.sent)] = per_s.get(int(r.sent), 0) + 1
    span = max(1, int(float(driver.trace.meta.get("duration_s") or 0)))
    counts = [per_s.get(s, 0) for s in range(span)]
    return {
        "mean_per_s": sum(counts) / span, "p99_per_s": percentile(counts, 99),
        "peak_per_s": max(counts)
    }


def fleet_summary(driver: FleetDriver, wall_s: float, slo: SLO | None = None,
                  router_busy: float | None = None) -> dict:
    slo = slo or SLO()
    out = summarize(driver, wall_s)
    recs = list(driver.records.values())
    spec = driver.spec
    out.update({
        "nodes": len(driver.backends), "replicas": spec.replicas, "replica_by": spec.replica_by,
        "policy": spec.policy, "affinity_floor": spec.floor, "scrape_s": spec.scrape_s,
        "editor_slo_s": slo.editor_ttft_s,
        "editor_goodput": goodput([r for r in recs if r.kind == "editor"], slo.editor_ttft_s),
        "agent_goodput": goodput([r for r in recs if r.kind == "agent"],
                                 slo.agent_ttft_s), "replica_agreement": driver.agreement[0] /
        driver.agreement[1] if driver.agreement[1] else None,
        "decisions": dict(sorted(driver.decisions.items())), "request_rate": request_rate(driver),
        "node_loss": node_loss(driver), "timeline": timeline(driver, slo.editor_ttft_s)
    })
    choose = statistics.fmean(driver.choose_cpu) if driver.choose_cpu else 0.0
    out["router_cpu"] = router_cost(choose, out["request_rate"]["peak_per_s"], router_busy)
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else ("> deadline" if math.isinf(v) else f"{1000 * v:.0f} ms")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def fleet_rows(s: dict) -> list[tuple[str, str]]:
    rate, cpu = s["request_rate"], s["router_cpu"]
    rows = [("nodes x router replicas",
             f"{s['nodes']} x {s['replicas']} ({s['replica_by']}, {s['policy']})"),
            ("requests (peak / mean per s)",
             f"{s['requests']} ({rate['peak_per_s']} / {rate['mean_per_s']:.1f})"),
            (f"editor goodput (TTFT <= {_ms(s['editor_slo_s'])})", _pct(s["editor_goodput"])),
            ("editor TTFT p50 / p99",
             f"{_ms(s.get('editor_ttft_p50_s'))} / {_ms(s.get('editor_ttft_p99_s'))}"),
            ("prefix-cache hit rate", _pct(s["prefix_hit_rate"])),
            ("replica agreement", _pct(s["replica_agreement"])),
            ("affinity kept / broken by load", f"{s['decisions'].get('affinity_kept', 0)} / "
             f"{s['decisions'].get('affinity_broken_load', 0)}"),
            ("router CPU per request (proxy + choose)", f"{1000 * cpu['per_request_s']:.2f} ms "
             f"({1000 * cpu['proxy_path_s']:.2f} + {1000 * cpu['choose_s']:.2f})"),
            ("router replicas for the peak (CPU)",
             f"{cpu['replicas_for_cpu']} (at {100 * cpu['busy']:.0f}% "
             "of a core each)")]
    k = s.get("node_loss")
    if k:
        rows += [("node loss",
                  f"{k['node']} at {k['at_s']:.0f} s: {k['sessions_homed']} sessions homed there, "
                  f"{k['in_flight']} requests in flight"),
                 ("  failed over / cut streams / lost",
                  f"{k['failed_over']} / {k['cut_streams']} / {k['lost']}"),
                 ("  cold prefills caused (tokens)",
                  f"{k['cold_prefills']} of {k['sessions_homed_returning']} "
                  f"returning ({k['cold_prefill_tokens']})"),
                 ("  other sessions moved", str(k["other_sessions_moved"])),
                 (f"  hit rate {k['window_s']:.0f} s before / after",
                  f"{_pct(k['hit_rate_before'])} / "
                  f"{_pct(k['hit_rate_after'])}")]
    rows.append(("simulated / wall time", f"{s['simulated_s']:.0f} s / {s['wall_s']:.0f} s"))
    return rows


def fleet_table(summaries: list[dict], names: list[str]) -> str:
    rows = [dict(fleet_rows(s)) for s in summaries]
    labels = list(dict.fromkeys(label for r in rows for label in r))
    lines = ["| figure | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += [
        f"| {label} | " + " | ".join(r.get(label, "-") for r in rows) + " |" for label in labels
    ]
    return "\n".join(lines)
