r"""Does the simulator tell the truth? The same small editor trace through the real engine (the
profile's model, wall clock) and through the simulator (the engine's scheduler and block pool + the
profile's calibrated cost model, virtual clock), with the same client behaviour (debounce, cancel on
keystroke, client deadline).

    python benchmarks/sim_validation.py [--profile cpu-smollm2 --developers 4 --duration 240 \
                                         --rate 20 --deadline-ms 3000]

Goal (issue #8): prefix hit rate within 2 points, editor TTFT p50 within 25%. The client deadline is
3 s here (not the editor's 300 ms) so that TTFT is measured rather than censored on this slow CPU.
Writes benchmarks/results/sim_validation.json.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from warmpath.client.editor import ClientConfig
from warmpath.config import EngineConfig
from warmpath.engine.engine import Engine
from warmpath.sim import tokenizer_for
from warmpath.sim.backends import RealBackend, SimBackend
from warmpath.sim.driver import Driver
from warmpath.sim.profiles import get_profile
from warmpath.sim.report import summarize, table
from warmpath.workloads import make_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="cpu-smollm2",
                    help="a profile with a model here (cpu-qwen2.5-coder-0.5b ...)")
    ap.add_argument("--developers", type=int, default=4)
    ap.add_argument("--duration", type=float, default=240)
    ap.add_argument("--rate", type=float, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline-ms", type=float, default=3000)
    ap.add_argument("--json", default="benchmarks/results/sim_validation.json")
    args = ap.parse_args()
    trace = make_trace("editor", args.developers, args.duration, args.seed, args.rate)
    profile = get_profile(args.profile)
    tokenize = tokenizer_for(profile, "model")
    client = replace(ClientConfig(), deadline_ms=args.deadline_ms,
                     max_time_ms=max(3000.0, args.deadline_ms))

    engine = Engine(EngineConfig(model=profile.model_spec, dtype=profile.calibrate_dtype))
    real = Driver(trace, [RealBackend(engine, 0.0)], tokenize, client, realtime=True,
                  fim=profile.fim)
    real.backends[0].origin = real._origin
    t = time.perf_counter()
    real.run()
    real_summary = summarize(real, time.perf_counter() - t)

    sim = Driver(trace, [
        SimBackend(profile.cost[profile.default_dtype], engine.pool.num_blocks, profile.block_size,
                   engine.config.scheduler.max_num_batched_tokens)
    ], tokenize, client, fim=profile.fim)
    t = time.perf_counter()
    sim.run()
    sim_summary = summarize(sim, time.perf_counter() - t)

    print(
        f"editor trace: {args.developers} developers, {args.duration:.0f} s, idle x{args.rate}, "
        f"seed {args.seed}; "
        f"client deadline {args.deadline_ms:.0f} ms; {engine.pool.num_blocks} KV blocks; cost "
        "model: "
        f"{profile.sources['cost']}\n")
    print(table([real_summary, sim_summary], ["real engine", "simulator"]))
    hit_gap = abs(real_summary["prefix_hit_rate"] - sim_summary["prefix_hit_rate"]) * 100
    ttft_ratio = sim_summary["editor_ttft_p50_s"] / real_summary["editor_ttft_p50_s"]
    print(
        f"\nhit rate gap: {hit_gap:.1f} points (goal <= 2); TTFT p50 sim / real: {ttft_ratio:.2f} "
        f"(goal 0.75-1.25)")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {
                "args": vars(args), "profile": profile.name, "cost": profile.sources["cost"],
                "real": real_summary, "sim": sim_summary, "hit_rate_gap_points": hit_gap,
                "ttft_p50_ratio": ttft_ratio
            }, indent=1, default=str))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
