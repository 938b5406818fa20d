"""The `warmpath simulate` command: capacity questions answered in seconds, by driving the engine's own
Scheduler and BlockPool (and the router's own policies for fleets) with a cost model instead of a model."""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from dataclasses import asdict, replace
from pathlib import Path

from warmpath.config import ClientConfig, SimConfig
from warmpath.router.policies import POLICIES, Router
from warmpath.sim.cost import save_calibration
from warmpath.sim.driver import Driver, SimBackend
from warmpath.sim.fleet_command import add_fleet_arguments, run_fleet
from warmpath.sim.profiles import PROFILES, Profile, get_profile
from warmpath.sim.report import summarize, table
from warmpath.workloads import AgentParams, Trace, make_trace

S = SimConfig
SWEEPS = ("pool", "budget", "dtype", "nodes", "replicas")


def chunk_tokenizer(text: str) -> list[int]:
    """~4 characters per token, ids from the characters: a shared text prefix gives a shared id prefix, which
    is all prefix caching looks at (for models whose tokenizer is not on this machine)."""
    return [zlib.crc32(text[i:i + 4].encode()) % 100_000 + 2 for i in range(0, len(text), 4)]


def tokenizer_for(profile: Profile, choice: str):
    """The bundled model's tokenizer for its profile (or asked for); the chars estimate otherwise, or when the
    model file is not on this machine (unless asked for)."""
    if choice == "chars" or (choice == "auto" and profile.name != "cpu-smollm2"):
        return chunk_tokenizer
    from warmpath.models.registry import load_tokenizer

    try:
        return load_tokenizer("smollm2").encode
    except FileNotFoundError:
        if choice == "model":
            raise
        return chunk_tokenizer


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default=S.profile, choices=list(PROFILES))
    p.add_argument("--workload", default=S.workload, choices=["editor", "agent", "mixed"])
    p.add_argument("--sessions", "--developers", dest="sessions", type=int, default=S.sessions)
    p.add_argument("--duration", type=float, default=S.duration, help="simulated seconds of traffic")
    p.add_argument("--rate", type=float, default=S.rate, help="compress idle time N x (1 = real time)")
    p.add_argument("--seed", type=int, default=S.seed)
    p.add_argument("--trace", help="replay a trace saved by `warmpath bench --save-trace` instead")
    p.add_argument("--weights-dtype", help="default: the profile's")
    p.add_argument("--num-kv-blocks", type=int, help="default: what the profile's memory leaves beside the weights")
    p.add_argument("--max-num-batched-tokens", type=int, help="per-step token budget (default: the profile's)")
    p.add_argument("--nodes", type=int, default=S.nodes)
    p.add_argument("--policy", default=S.policy, choices=list(POLICIES))
    p.add_argument("--deadline-ms", type=float, default=ClientConfig.deadline_ms,
                   help="editor client first-token deadline")
    p.add_argument("--tokenizer", default=S.tokenizer, choices=["auto", "model", "chars"])
    p.add_argument("--sweep", choices=SWEEPS, help="pool size | token budget | weights dtype | nodes x policy "
                   "(--fleet: the fewest nodes for --target-goodput) | replicas (--fleet: agreement)")
    p.add_argument("--calibrate", action="store_true", help="fit the cpu-smollm2 step-time model to the real "
                   "engine on this machine and save it (then simulate with it)")
    p.add_argument("--json", dest="json_path")
    p.add_argument("--plot", help="PNG (sweeps: the sweep's curves; else pool use and resident sessions over time)")
    add_fleet_arguments(p)


def build_trace(args, profile: Profile) -> Trace:
    if args.trace:
        return Trace.load(args.trace)
    agent = None
    if profile.name.startswith("h100"):  # long agent contexts at GPU scale, mostly identical turn to turn
        agent = AgentParams(start_tokens=40_000, max_context_tokens=60_000)
    return make_trace(args.workload, args.sessions, args.duration, args.seed, args.rate, agent=agent)


def simulate(trace: Trace, profile: Profile, tokenize, dtype: str, num_blocks: int, budget: int,
             nodes: int = S.nodes, policy: str = S.policy, client: ClientConfig | None = None) -> tuple[dict, Driver]:
    cost = profile.cost[dtype]
    backends = [SimBackend(cost, num_blocks, profile.block_size, budget) for _ in range(nodes)]
    router = Router([f"node{i}" for i in range(nodes)], policy) if nodes > 1 else None
    driver = Driver(trace, backends, tokenize, client, router)
    t = time.perf_counter()
    driver.run()
    return summarize(driver, time.perf_counter() - t), driver


def run(args: argparse.Namespace) -> int:
    if args.calibrate:
        from warmpath.sim.calibrate import calibrate

        cost, meta = calibrate("smollm2", "float32")
        path = save_calibration("cpu-smollm2", cost, meta)
        print(f"calibrated cpu-smollm2: {cost}\n  median step-time error {100 * meta['median_relative_error']:.1f}%, "
              f"max {100 * meta['max_relative_error']:.1f}% over {len(meta['samples'])} shapes; saved {path}")
    try:
        profile = get_profile(args.profile)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    dtype = args.weights_dtype or profile.default_dtype
    if dtype not in profile.cost:
        print(f"error: profile {profile.name} has weights dtypes {', '.join(profile.cost)}", file=sys.stderr)
        return 2
    blocks = args.num_kv_blocks or profile.num_kv_blocks(dtype)
    budget = args.max_num_batched_tokens or profile.max_num_batched_tokens
    t = time.perf_counter()
    trace = build_trace(args, profile)
    tokenize = tokenizer_for(profile, args.tokenizer)
    client = replace(ClientConfig(), deadline_ms=args.deadline_ms)
    print(f"{profile.name} ({profile.sources.get('cost', 'paper profile')}); {args.workload} trace, "
          f"{len(trace.sessions)} sessions, {trace.meta.get('duration_s')} s simulated "
          f"(built in {time.perf_counter() - t:.1f} s); weights {dtype}, {blocks} KV blocks x {profile.block_size} "
          f"tokens per node, budget {budget} tokens/step", file=sys.stderr)
    if args.fleet:
        return run_fleet(args, profile, trace, tokenize, dtype, blocks, budget, client)
    if args.sweep == "replicas":
        print("error: --sweep replicas needs --fleet", file=sys.stderr)
        return 2
    runs: list[tuple[str, dict]] = []
    if not args.sweep:
        s, driver = simulate(trace, profile, tokenize, dtype, blocks, budget, args.nodes, args.policy, client)
        runs.append((f"{args.nodes} node(s), {args.policy}" if args.nodes > 1 else profile.name, s))
        if args.plot:
            from warmpath.sim.plot import plot_timeline

            plot_timeline(driver, args.plot, f"warmpath simulate: {profile.name}, {args.workload}, "
                                             f"{len(trace.sessions)} sessions")
    elif args.sweep == "pool":
        for f in (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1, 2):
            n = max(16, int(blocks * f))
            runs.append((f"{n} blocks", simulate(trace, profile, tokenize, dtype, n, budget, client=client)[0]))
    elif args.sweep == "budget":
        for b in (64, 128, 256, 512, 1024, 2048):
            runs.append((f"budget {b}", simulate(trace, profile, tokenize, dtype, blocks, b, client=client)[0]))
    elif args.sweep == "dtype":
        for d in profile.cost:
            n = profile.num_kv_blocks(d)
            runs.append((f"{d} ({n} blocks)", simulate(trace, profile, tokenize, d, n, budget, client=client)[0]))
    elif args.sweep == "nodes":
        for n_nodes in (2, 4, 8):
            for pol in ("round-robin", "least-load", "prefix", "session", "hybrid"):
                s = simulate(trace, profile, tokenize, dtype, blocks, budget, n_nodes, pol, client)[0]
                runs.append((f"{n_nodes} x {pol}", s))
    names, summaries = [n for n, _ in runs], [s for _, s in runs]
    print(table(summaries, names))
    if args.sweep and args.plot:
        from warmpath.sim.plot import plot_sweep

        plot_sweep(args.sweep, names, summaries, args.plot, f"warmpath simulate --sweep {args.sweep}: "
                   f"{profile.name}, {args.workload}, {len(trace.sessions)} sessions, {trace.meta.get('duration_s')} s")
    if args.plot:
        print(f"wrote {args.plot}")
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        report = {"command": " ".join(["warmpath", "simulate", *sys.argv[2:]]), "profile": profile.name,
                  "sources": profile.sources, "cost": {d: asdict(c) for d, c in profile.cost.items()},
                  "trace": trace.meta, "runs": dict(zip(names, summaries, strict=True))}
        Path(args.json_path).write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {args.json_path}")
    return 0
