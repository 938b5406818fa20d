"""Capacity answers from fleet runs: how many router replicas a request rate needs (the router's own
CPU per request), and the fewest nodes that keep goodput at a target.

A router replica is one `warmpath route` process: one asyncio loop, so one core however many the
machine has (several uvicorn workers would be several replicas, each with its own counts). Its CPU
per request is the proxy path (HTTP in, JSON, the relay of the node's stream), measured once on a
real router by benchmarks/router_cpu.py, plus `Router.choose` at the fleet's size, which grows with
the node count and is timed live by the simulator as it routes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from warmpath.config import SimConfig

# benchmarks/router_cpu.py: one real router in front of one real node, editor requests (max_tokens
# 16, streamed); the router process's CPU per request less Router.choose at one node. See
# ROUTER_MEASURED.
ROUTER_PROXY_CPU_S = 0.00838
ROUTER_MEASURED = (
    "benchmarks/router_cpu.py (benchmarks/results/router_cpu.json): AMD EPYC, 2 cores shared with "
    "the node and the client, Python 3.11, 2026-12-01; the dearer of 1 and 8 concurrent streams")


def router_cost(choose_s: float, peak_per_s: float, busy: float | None = None) -> dict:
    """Replicas needed for the peak on CPU alone: peak rate x CPU per request / the share of a core
    a replica is planned to use (headroom for bursts inside the second, GC, health checks). Two or
    more for availability is a separate, smaller question."""
    busy = busy or SimConfig.router_busy
    per_request = ROUTER_PROXY_CPU_S + choose_s
    return {
        "proxy_path_s": ROUTER_PROXY_CPU_S, "choose_s": choose_s, "per_request_s": per_request,
        "peak_per_s": peak_per_s, "busy": busy, "core_share_at_peak": peak_per_s * per_request,
        "replicas_for_cpu": max(1, math.ceil(peak_per_s * per_request / busy)),
        "measured": ROUTER_MEASURED
    }


def fewest_nodes(run: Callable[[int], dict], target: float, hi: int, lo: int = 1,
                 key: str = "editor_goodput",
                 probes: dict[int, dict] | None = None) -> tuple[int | None, dict[int, dict]]:
    """The fewest nodes whose run keeps summary[key] >= target, by bisection between lo and hi
    (goodput taken as not falling when nodes are added); hi doubles (to 4x) while it misses. Every
    probe's summary is kept (`probes`: runs already made)."""
    probes = {} if probes is None else probes

    def ok(n: int) -> bool:
        if n not in probes:
            probes[n] = run(n)
        v = probes[n].get(key)
        return v is not None and v >= target

    top = hi
    while not ok(hi):
        if hi >= 4 * top:
            return None, probes
        lo, hi = hi + 1, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi, probes
