"""Chunk pacing: while another session is quick (decoding, or typing on a warm prefix), a prompt
chunk holds only what a step of config.step_target_ms computes, so a keystroke arriving behind
another session's long prompt waits for a short step, not a full-budget one. Cold sessions alone are
never paced: every step costs its fixed part too."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from warmpath.engine.request import Request
from warmpath.engine.step_cost import StepCost

# a session that sent a request this recently is still typing (bursts: a request every ~1-2 s)
ACTIVE_S = 5.0
# a request needing more paced chunks than this misses an editor's deadline anyway: not "quick"
QUICK_CHUNKS = 4


@dataclass
class Pacing:
    step_target_ms: float  # 0: off
    block_size: int
    cost: StepCost
    # session -> when a quick request came
    _quick_seen: dict[str | None, float] = field(default_factory=dict)

    @property
    def latency_chunk(self) -> int | None:
        """A prompt chunk's most tokens while others are quick: what a step of step_target_ms
        computes on this machine and model (a block at least); None while off or not measured yet
        (chunks fill the budget)."""
        if not self.step_target_ms:
            return None
        return self.cost.tokens_within(self.step_target_ms / 1000, self.block_size)

    def note(self, session_id: str | None, uncached_tokens: int, now: float) -> None:
        """A request of session came: the session is quick if the prefix cache leaves it a few
        chunks to compute at most, and from this step on the others' prompt chunks are kept short
        for it."""
        chunk = self.latency_chunk
        self._quick_seen = {
            s: t
            for s, t in self._quick_seen.items() if now - t < ACTIVE_S and s != session_id
        }
        if chunk is not None and uncached_tokens <= QUICK_CHUNKS * chunk:
            self._quick_seen[session_id] = now

    def quick_sessions(self, now: float, running: Iterable[Request]) -> set[str | None]:
        """The sessions a long prompt chunk would hold up: those decoding now, and those whose last
        request (in the last ACTIVE_S) came needing a few chunks at most beyond the prefix cache:
        still typing, each keystroke answered in a short step if it does not wait behind a long
        one."""
        return {s for s, t in self._quick_seen.items() if now - t < ACTIVE_S} | \
            {r.session_id for r in running if r.output_token_ids and not r.warmup}

    def quick_until(self, running: Iterable[Request]) -> float:
        """Until when quick_sessions() stays non-empty if nothing else happens: for a reader that
        holds a snapshot of this moment (AsyncEngine.estimate_wait)."""
        if any(r.output_token_ids and not r.warmup for r in running):
            return float("inf")
        return max((t + ACTIVE_S for t in self._quick_seen.values()), default=float("-inf"))
