"""A node's load as bounded loads count it: the requests this router has open there, or what the
node's own /metrics says (every router replica's requests, and the node's queue), whichever is
larger.

One router replica sees only its own requests; the node's gauges see all of them, a scrape interval
late. The larger of the two is fresh for this replica's own burst and complete for the fleet's. A
queued request weighs twice (it waits behind the running ones, and says the node is saturated), and
a node whose KV cache is nearly full carries the affinity floor on top (its next session would
preempt or queue). Two replicas that scrape the same nodes see the same loads, so they place the
same sessions on the same nodes while their own bursts stay under the floor (router/hashing.py:
below it affinity is never broken).
"""

from __future__ import annotations

from warmpath.router.engines import NodeLoad

KV_FULL = 0.9  # share of a node's KV cache in use past which it counts as full


def node_load(own: int, scraped: NodeLoad | None, floor: int) -> float:
    if scraped is None:
        return float(own)
    load = max(float(own), scraped.requests) + scraped.waiting
    return load + floor if scraped.kv_usage >= KV_FULL else load
