"""Pictures of simulated runs: a sweep's curves, or one run's pool use and resident sessions over
time."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from warmpath.sim.driver import Driver  # noqa: E402


def _v(s: dict, key: str) -> float:
    v = s.get(key)
    return float("nan") if v is None or (isinstance(v, float) and math.isinf(v)) else float(v)


def plot_sweep(sweep: str, names: list[str], summaries: list[dict], path: str, title: str) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    if sweep == "pool":
        x = [s["pool_blocks"] for s in summaries]
        left.plot(x, [_v(s, "max_resident_sessions_before_preemption") for s in summaries], "o-",
                  label="sessions resident before the first preemption")
        left.plot(x, [_v(s, "max_resident_sessions") for s in summaries], "s--",
                  label="sessions resident (max)")
        left.set_xscale("log", base=2)
        left.set_xlabel("KV pool (blocks of 16 tokens, log)")
        left.set_ylabel("sessions whose prefix is warm")
        right.plot(x, [100 * _v(s, "prefix_hit_rate") for s in summaries], "o-",
                   label="prefix-cache hit rate (%)")
        right.plot(x, [1000 * _v(s, "editor_ttft_p50_s") for s in summaries], "s--",
                   label="editor TTFT p50 (ms)")
        right.set_xscale("log", base=2)
        right.set_xlabel("KV pool (blocks of 16 tokens, log)")
    elif sweep == "budget":
        x = [int(n.split()[-1]) for n in names]
        left.plot(x, [1000 * _v(s, "itl_p99_s") for s in summaries], "o-",
                  label="inter-token p99 (ms)")
        left.set_xscale("log", base=2)
        left.set_xlabel("token budget per step (log)")
        left.set_ylabel("ms")
        key = "agent_ttft_p50_s" if any(s.get("agent_ttft_p50_s")
                                        for s in summaries) else "editor_ttft_p50_s"
        right.plot(x, [_v(s, key) for s in summaries], "o-",
                   label=key.replace("_", " ").replace(" s", " (s)"))
        right.set_xscale("log", base=2)
        right.set_xlabel("token budget per step (log)")
    else:  # dtype, nodes: bars
        idx = range(len(names))
        left.bar(idx, [100 * _v(s, "prefix_hit_rate") for s in summaries])
        left.set_xticks(list(idx), names, rotation=45, ha="right", fontsize=8)
        left.set_ylabel("prefix-cache hit rate (%)")
        right.bar(idx, [1000 * _v(s, "editor_ttft_p50_s") for s in summaries],
                  label="editor TTFT p50 (ms)")
        right.set_xticks(list(idx), names, rotation=45, ha="right", fontsize=8)
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timeline(driver: Driver, path: str, title: str) -> None:
    t = [s.t / 60 for s in driver.samples]
    blocks = sum(b.pool.num_blocks for b in driver.backends)
    fig, ax = plt.subplots(figsize=(11, 4))
    ax.plot(t, [100 * s.used_blocks / blocks for s in driver.samples],
            label="blocks held by requests (%)")
    ax.plot(t, [100 * min(s.cached_blocks, blocks) / blocks for s in driver.samples],
            label="blocks caching a prefix (%)")
    ax.set_xlabel("simulated minutes")
    ax.set_ylabel("% of the pool")
    twin = ax.twinx()
    twin.plot(t, [s.resident_sessions for s in driver.samples], color="black", linewidth=1,
              label="warm sessions")
    twin.set_ylabel("sessions with a warm prefix")
    if driver.first_preemption is not None:
        ax.axvline(driver.first_preemption / 60, color="red", linestyle="--", linewidth=1)
    ax.legend(loc="upper left", fontsize=8)
    twin.legend(loc="upper right", fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_fleet(sweep: str | None, names: list[str], summaries: list[dict], path: str, title: str,
               target: float | None = None) -> None:
    """One fleet run: hit rate and editor goodput over time (the node's loss marked); sweeps:
    goodput and hit rate against nodes, or agreement and hit rate against replicas."""
    fig, ax = plt.subplots(figsize=(11, 4))
    if sweep in ("nodes", "replicas"):
        x = [s["nodes" if sweep == "nodes" else "replicas"] for s in summaries]
        first = "editor_goodput" if sweep == "nodes" else "replica_agreement"
        ax.plot(x, [100 * _v(s, first) for s in summaries], "o-",
                label=first.replace("_", " ") + " (%)")
        ax.plot(x, [100 * _v(s, "prefix_hit_rate") for s in summaries], "s--",
                label="prefix-cache hit rate (%)")
        ax.set_xlabel("nodes" if sweep == "nodes" else "router replicas")
        if target is not None:
            ax.axhline(100 * target, color="gray", linestyle=":", linewidth=1,
                       label="goodput target")
    else:
        s = summaries[0]
        t = [b["t"] / 60 for b in s["timeline"]]
        ax.plot(t, [100 * _v(b, "hit_rate") for b in s["timeline"]],
                label="prefix-cache hit rate (%)")
        ax.plot(t, [100 * _v(b, "editor_goodput") for b in s["timeline"]],
                label="editor goodput (%)")
        if s.get("node_loss"):
            ax.axvline(s["node_loss"]["at_s"] / 60, color="red", linestyle="--", linewidth=1,
                       label=f"{s['node_loss']['node']} dies")
        ax.set_xlabel("simulated minutes")
    ax.set_ylabel("%")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
