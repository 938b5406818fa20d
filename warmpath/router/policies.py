"""Routing policies: which node serves a request, and in what order to fail over.

Each policy returns the candidate nodes best first plus the name of the decision it took (counted in
/metrics). Loads are router/scorer.py's: this router's open requests or the node's own gauges, the
larger.

- round-robin, least-load: the baselines (round-robin throws warm prefixes away).
- session: consistent hashing with bounded loads on the session key (X-Session-Id, else `user`).
- prefix: the node whose recently routed prompts share the longest prefix with this one (an
  approximate, bounded, LRU-aged index of block hashes per node), unless it is over the load bound.
- hybrid (default): session when a key is present, else prefix when some node matches, else
  least-load.
"""

from __future__ import annotations

import hashlib
import itertools
import sys
import time
import typing
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from warmpath.config import RoutingPolicy
from warmpath.router.hashing import HashRing, bounded_order, load_cap

POLICIES = typing.get_args(RoutingPolicy)
# A node gone from the pool keeps its prefix index this long: one back soon (a nodes file edited
# twice, a node drained out and in) still holds what it held. A node that restarts meanwhile fails
# its checks (forget()).
DEPARTED_S = 60.0


@dataclass
class RouteKey:
    """What a policy may look at: the session key and the prompt's text for prefix matching."""

    session: str | None
    prompt: str


@dataclass
class Decision:
    nodes: list[str]  # best first; the rest are failover candidates
    # affinity_kept | affinity_broken_load | prefix_match | prefix_broken_load | least_load |
    # round_robin
    decision: str


def prompt_blocks(prompt: str, block_chars: int) -> list[bytes]:
    """Chained hashes of the prompt's full blocks of `block_chars` characters: block i's hash covers
    the whole prefix up to it, so a match on block i implies a match on every block before it (as in
    the KV cache)."""
    hashes, parent = [], b""
    for start in range(0, len(prompt) - block_chars + 1, block_chars):
        # any JSON string routes
        block = prompt[start:start + block_chars].encode("utf-8", "surrogatepass")
        parent = hashlib.blake2b(parent + block, digest_size=8).digest()
        hashes.append(parent)
    return hashes


DIGEST_OBJECT_BYTES = sys.getsizeof(b"\0" * 8)


@dataclass
class PrefixIndex:
    """Block hashes of prompts routed to one node, at most `capacity`, least recently routed dropped
    first (the node's own LRU evicts in roughly the same order)."""

    capacity: int
    blocks: OrderedDict[bytes, None] = field(default_factory=OrderedDict)

    def match(self, hashes: list[bytes]) -> int:
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            n += 1
        return n

    def add(self, hashes: list[bytes]) -> None:
        for h in hashes:
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)

    def clear(self) -> None:
        self.blocks.clear()

    def nbytes(self) -> int:
        """Its memory: the table and each block's digest object (~185 bytes a block in CPython
        3.11)."""
        return sys.getsizeof(self.blocks) + len(self.blocks) * DIGEST_OBJECT_BYTES


class Router:
    """Holds every policy's state; `choose()` applies the configured one to the nodes available
    now."""

    def __init__(self, nodes: list[str], policy: str = "hybrid", load_factor: float = 1.25,
                 virtual_nodes: int = 100, block_chars: int = 64, index_blocks: int = 65536,
                 floor: int = 0):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        if load_factor < 1.0:
            raise ValueError("load_factor must be >= 1 (below 1 no placement satisfies the bound)")
        self.policy, self.c, self.block_chars, self.floor = policy, load_factor, block_chars, floor
        self.virtual_nodes, self.index_blocks = virtual_nodes, index_blocks
        self.nodes: list[str] = []
        self.index: dict[str, PrefixIndex] = {}
        # node -> (when it left, its index)
        self.departed: dict[str, tuple[float, PrefixIndex]] = {}
        self.clock = time.monotonic
        self.set_nodes(nodes)
        self._turn = itertools.count()

    def set_nodes(self, nodes: list[str]) -> None:
        """The pool's members (a nodes file changed): the ring is rebuilt from the names, so only
        the keys of a node that came or went move; the prefix index of every node that stays is
        kept, and of one that left it is kept DEPARTED_S for its return."""
        now = self.clock()
        self.departed = {n: d for n, d in self.departed.items() if now - d[0] < DEPARTED_S}
        self.departed.update({n: (now, i) for n, i in self.index.items() if n not in nodes})
        self.nodes = list(nodes)
        self.ring = HashRing(self.nodes, self.virtual_nodes)
        self.index = {
            n: self.index.get(n) or self.departed.pop(n, (0.0, None))[1] or
            PrefixIndex(self.index_blocks)
            for n in self.nodes
        }

    def choose(self, key: RouteKey, available: list[str], loads: Mapping[str, float]) -> Decision:
        if not available:
            return Decision([], "no_node")
        policy = self.policy
        if policy == "hybrid":
            policy = "session" if key.session else "prefix"
        if policy == "round-robin":
            i = next(self._turn) % len(available)
            return Decision(available[i:] + available[:i], "round_robin")
        if policy == "least-load":
            return Decision(self._by_load(available, loads), "least_load")
        blocks = prompt_blocks(key.prompt, self.block_chars)
        if policy == "session" and key.session:
            # ring order: its first node is the home
            walk = self.ring.walk(key.session, set(available))
            order, home = bounded_order(walk, loads, self.c, self.floor), walk[0]
            decision = Decision(order,
                                "affinity_kept" if order[0] == home else "affinity_broken_load")
        else:  # prefix (also session without a key)
            decision = self._prefix(blocks, available, loads)
        self.index[decision.nodes[0]].add(blocks)
        return decision

    def _prefix(self, blocks: list[bytes], available: list[str], loads: Mapping[str,
                                                                                float]) -> Decision:
        matches = {n: self.index[n].match(blocks) for n in available}
        best = max(matches.values())
        by_load = self._by_load(available, loads)
        if best == 0:
            return Decision(by_load, "least_load")
        cap = load_cap(loads, available, self.c, self.floor)
        ranked = sorted(available, key=lambda n: (-matches[n], loads.get(n, 0)))
        for n in ranked:
            if matches[n] > 0 and loads.get(n, 0) + 1 <= cap:
                outcome = "prefix_match" if matches[n] == best else "prefix_broken_load"
                return Decision([n] + [m for m in ranked if m != n], outcome)
        return Decision(by_load, "prefix_broken_load")  # every matching node is over the bound

    def _by_load(self, available: list[str], loads: Mapping[str, float]) -> list[str]:
        i = next(self._turn) % len(available)  # ties rotate, so idle nodes share new work
        return sorted(available[i:] + available[:i], key=lambda n: loads.get(n, 0))

    def forget(self, node: str) -> None:
        """A node that lost its cache (restart) no longer holds what the index says."""
        if node in self.index:
            self.index[node].clear()
        self.departed.pop(node, None)
