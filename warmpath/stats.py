"""Percentiles as the reports of `warmpath bench` and `warmpath simulate` compute them, and the one
moving average of measured times."""

from __future__ import annotations

import math
from dataclasses import dataclass


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (the smallest value with at least q% of the values at or below it);
    +inf values (censored TTFTs) sort last; nan for no values."""
    xs = sorted(values)
    if not xs:
        return math.nan
    k = max(0, math.ceil(q / 100 * len(xs)) - 1)
    return xs[k]


@dataclass
class MovingAverage:
    """An exponentially weighted mean of the latest measurements (a step's time, a block's read, a
    guess's cost): recent enough to follow a machine whose load changes, smooth enough that one odd
    step moves it little. None until the first measurement."""

    weight: float = 0.2  # of each new measurement
    value: float | None = None

    def add(self, x: float) -> float:
        self.value = x if self.value is None else (1 - self.weight) * self.value + self.weight * x
        return self.value
