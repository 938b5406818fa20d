"""Percentiles as the reports of `warmpath bench` and `warmpath simulate` compute them."""

from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (the smallest value with at least q% of the values at or below it); +inf values
    (censored TTFTs) sort last; nan for no values."""
    xs = sorted(values)
    if not xs:
        return math.nan
    k = max(0, math.ceil(q / 100 * len(xs)) - 1)
    return xs[k]
