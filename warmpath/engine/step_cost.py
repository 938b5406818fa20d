"""What a step costs on this machine and model, learned once per step from the steps run: a step's
seconds are about `overhead + tokens x per_token`. Big steps (prompt chunks) teach the per-token
cost, small ones (decodes) the overhead. The engine feeds it (Engine.step), as the simulator feeds
it its cost model's steps; its readers: the scheduler's paced chunk and its choice between reading a
block back from the KV tier and computing it, and the admission estimate
(AsyncEngine.estimate_wait). The FIM suffix budget reads only the start-up figure
(`prompt_seconds_per_token`): a budget that moved with the load would change prompts, and so the
prefix cache."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmpath.stats import MovingAverage

# tokens: a step of this many or more teaches the per-token cost; a smaller one the overhead
BIG_STEP = 64


@dataclass
class StepCost:
    # a prompt chunk timed at start (plan_timing.prompt_speed)
    prompt_seconds_per_token: float | None = None
    _per_token: MovingAverage = field(default_factory=MovingAverage)
    _overhead: MovingAverage = field(default_factory=MovingAverage)

    @classmethod
    def measured(cls, prompt_seconds_per_token: float, tokens: int = BIG_STEP) -> StepCost:
        """Starting from a prompt chunk of `tokens` timed before the first request (its first
        step)."""
        cost = cls(prompt_seconds_per_token)
        cost.record(tokens, prompt_seconds_per_token * tokens)
        return cost

    def record(self, tokens: int, seconds: float) -> None:
        if tokens >= BIG_STEP:
            self._per_token.add(max(0.0, seconds - self.overhead) / tokens)
        elif tokens > 0:
            self._overhead.add(seconds)

    @property
    def per_token(self) -> float | None:
        """Seconds per computed token beyond a step's overhead (None: no big step yet)."""
        return self._per_token.value

    @property
    def overhead(self) -> float:
        """Seconds a step costs whatever it computes (0 until a small step has run)."""
        return self._overhead.value or 0.0

    def seconds(self, tokens: int, steps: int) -> float:
        """What `tokens` cost spread over `steps` steps (0 while nothing is known)."""
        return tokens * (self.per_token or 0.0) + (steps * self.overhead if tokens else 0.0)

    def tokens_within(self, seconds: float, multiple: int) -> int | None:
        """The most tokens (a multiple of `multiple`, one at least) a step of `seconds` holds; None:
        not known."""
        if self.per_token is None:
            return None
        fit = int(max(0.0, seconds - self.overhead) / max(self.per_token, 1e-12))
        return max(multiple, fit // multiple * multiple)
