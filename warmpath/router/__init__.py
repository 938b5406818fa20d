"""The router: session-affine, prefix-aware gateway in front of many nodes (`warmpath route`)."""

from warmpath.router.hashing import HashRing, bounded_walk
from warmpath.router.policies import POLICIES, Decision, RouteKey, Router

__all__ = ["POLICIES", "Decision", "HashRing", "RouteKey", "Router", "bounded_walk"]
