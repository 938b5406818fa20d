"""The bench picture: TTFT distributions of every target (CDF, log time axis, the SLO marked) beside
their prefix-cache hit rate and goodput."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def plot(summaries: list[dict], ttfts: list[list[float]], names: list[str], path: str, title: str,
         slo_s: float) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [2, 1]})
    for name, values in zip(names, ttfts, strict=True):
        if not values:
            continue
        xs = sorted(values)
        finite = [x for x in xs if math.isfinite(x)]
        ys = [(i + 1) / len(xs) for i in range(len(finite))]
        late = 1 - len(finite) / len(xs)
        left.step([10.0] + [x * 1000 for x in finite], [0.0] + ys, where="post",
                  label=f"{name}: n={len(xs)}, {late:.0%} never got a first token in time")
    left.axvline(slo_s * 1000, color="grey", linestyle="--", linewidth=1)
    left.set_xlim(10,
                  max([slo_s * 4000] + [x * 1500 for v in ttfts for x in v if math.isfinite(x)]))
    left.text(slo_s * 1000, 0.02, f" SLO {slo_s * 1000:.0f} ms", color="grey")
    left.set_xscale("log")
    left.set_xlabel("editor time to first token (ms, log); dropped-late requests never reach 1.0")
    left.set_ylabel("share of requests")
    left.set_ylim(0, 1.02)
    left.grid(True, which="both", alpha=0.3)
    left.legend(loc="upper left", fontsize=8)
    left.set_title("TTFT distribution")

    width = 0.8 / max(1, len(names))
    for i, (name, s) in enumerate(zip(names, summaries, strict=True)):
        hit = s.get("prefix_hit_rate")
        good = s.get("editor_goodput", s.get("agent_goodput"))
        vals = [0 if v is None or math.isnan(v) else v * 100 for v in (hit, good)]
        bars = right.bar([j + i * width for j in range(2)], vals, width, label=name)
        for b, v in zip(bars, (hit, good), strict=True):
            label = "n/a" if v is None or math.isnan(v) else f"{v * 100:.0f}%"
            right.text(b.get_x() + b.get_width() / 2,
                       b.get_height() + 1, label, ha="center", fontsize=8)
    right.set_xticks([j + width * (len(names) - 1) / 2 for j in range(2)],
                     ["prefix-cache hit rate", "goodput"])
    right.set_ylim(0, 110)
    right.set_ylabel("%")
    right.legend(loc="upper right", fontsize=8)
    right.set_title("cache and SLO")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
