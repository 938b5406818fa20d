"""Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018).

Every node owns `virtual_nodes` points on a 64-bit ring; a key belongs to the first node clockwise
from its hash. Removing a node moves only the keys it owned (to the next node on the ring); adding
it back returns them. With bounded loads a node takes one more request only while its load stays
within ceil(c * (total load + 1) / n): otherwise the key walks on to the next node on the ring. c >=
1 guarantees some node has room, and no node ever carries more than c times the average. Below a
floor of a few requests per node the bound is not applied: at 1-3 requests a node, c x average would
move sessions off their warm node for a load that costs less than the cold prefill the move causes.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable, Mapping


def hash64(text: str) -> int:
    """A real, stable hash (Python's hash() is salted per process)."""
    return int.from_bytes(
        hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


class HashRing:
    def __init__(self, nodes: Iterable[str], virtual_nodes: int = 100):
        self.nodes = list(dict.fromkeys(nodes))
        self.virtual_nodes = virtual_nodes
        points = sorted(
            (hash64(f"{node}#{i}"), node) for node in self.nodes for i in range(virtual_nodes))
        self._hashes = [h for h, _ in points]
        self._owners = [n for _, n in points]

    def walk(self, key: str, available: set[str] | None = None) -> list[str]:
        """Distinct nodes in ring order starting at the key's point; `available` filters (a node
        that is down or draining is skipped, so only its own keys move)."""
        if not self._hashes:
            return []
        want = len(self.nodes) if available is None else len(available & set(self.nodes))
        start = bisect.bisect_left(self._hashes, hash64(key))
        seen: dict[str, None] = {}  # insertion-ordered: ring order, O(1) membership
        for i in range(len(self._hashes)):
            node = self._owners[(start + i) % len(self._owners)]
            if node not in seen and (available is None or node in available):
                seen[node] = None
                if len(seen) == want:
                    break
        return list(seen)

    def home(self, key: str, available: set[str] | None = None) -> str | None:
        """The node that owns the key when loads are ignored."""
        order = self.walk(key, available)
        return order[0] if order else None


def load_cap(loads: Mapping[str, float], nodes: list[str], c: float, floor: int = 0) -> float:
    """The most load any node may hold once one more request is placed: ceil(c * (total + 1) / n),
    and never less than `floor`."""
    total = sum(loads.get(n, 0) for n in nodes) + 1
    return max(floor, math.ceil(c * total / len(nodes)))


def bounded_walk(ring: HashRing, key: str, loads: Mapping[str, float], c: float,
                 available: set[str] | None = None, floor: int = 0) -> list[str]:
    """Ring order from the key, the first node with room for one more request moved to the front
    (the rest stay in ring order: they are the failover candidates)."""
    return bounded_order(ring.walk(key, available), loads, c, floor)


def bounded_order(order: list[str], loads: Mapping[str, float], c: float,
                  floor: int = 0) -> list[str]:
    """bounded_walk on a ring walk already taken (its first node is the key's home)."""
    if not order:
        return order
    cap = load_cap(loads, order, c, floor)
    for i, node in enumerate(order):
        if loads.get(node, 0) + 1 <= cap:
            return [node] + order[:i] + order[i + 1:]
    return order  # unreachable for c >= 1: some node is at or below the average
