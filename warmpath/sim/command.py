"""The `warmpath simulate` command: capacity questions answered in seconds, by driving the engine's
own Scheduler and BlockPool (and the router's own policies for fleets) with a cost model instead of
a model."""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from dataclasses import asdict, replace
from pathlib import Path

from warmpath.config import KV_ELEMENT_BYTES, ClientConfig, SimConfig
from warmpath.models.footprint import parse_bytes
from warmpath.router.policies import POLICIES, Router
from warmpath.sim.backends import SimBackend
from warmpath.sim.cost import save_calibration
from warmpath.sim.driver import Driver
from warmpath.sim.fleet_command import add_fleet_arguments, run_fleet
from warmpath.sim.profiles import PROFILES, Profile, get_profile
from warmpath.sim.report import summarize, table
from warmpath.sim.tier import SimTier
from warmpath.workloads import AgentParams, Trace, make_trace

S = SimConfig
SWEEPS = ("pool", "budget", "dtype", "nodes", "replicas", "developers", "kv-tier")
KV_TIER_GIB = (0, 0.25, 0.5, 1, 2, 4, 8)  # --sweep kv-tier: the disk tier's sizes
DEVELOPERS = (1, 2, 3, 4, 6, 8, 12, 16)


def chunk_tokenizer(text: str) -> list[int]:
    """~4 characters per token, ids from the characters: a shared text prefix gives a shared id
    prefix, which is all prefix caching looks at (for models whose tokenizer is not on this
    machine)."""
    return [zlib.crc32(text[i:i + 4].encode()) % 100_000 + 2 for i in range(0, len(text), 4)]


def tokenizer_for(profile: Profile, choice: str):
    """The tokenizer of the profile's model; the chars estimate for a paper profile, when asked for,
    or when the model file is not on this machine (unless --tokenizer model asked for it)."""
    if choice == "chars" or profile.model_spec is None:
        return chunk_tokenizer
    from warmpath.models.registry import load_tokenizer

    try:
        return load_tokenizer(profile.model_spec).encode
    except FileNotFoundError:
        if choice == "model":
            raise
        return chunk_tokenizer


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default=S.profile, choices=list(PROFILES),
                   help="the hardware and model whose measured costs drive the simulation")
    p.add_argument("--workload", default=S.workload, choices=["editor", "agent", "mixed"],
                   help="editor: developers typing; agent: coding-agent turns; mixed: both")
    p.add_argument("--sessions", "--developers", dest="sessions", type=int, default=S.sessions,
                   help="developers (and agents, for mixed)")
    p.add_argument("--duration", type=float, default=S.duration,
                   help="simulated seconds of traffic")
    p.add_argument("--rate", type=float, default=S.rate,
                   help="compress idle time N x (1 = real time)")
    p.add_argument("--seed", type=int, default=S.seed,
                   help="the trace is the same for the same seed")
    p.add_argument("--trace", help="replay a trace saved by `warmpath bench --save-trace` instead")
    p.add_argument("--weights-dtype", help="default: the profile's")
    p.add_argument("--num-kv-blocks", type=int,
                   help="default: what the profile's memory leaves beside the weights")
    p.add_argument(
        "--kv-cache-dtype", choices=list(KV_ELEMENT_BYTES),
        help="the KV cache's dtype (default: the profile's; int8 holds ~2x the blocks of bfloat16)")
    p.add_argument("--max-num-batched-tokens", type=int,
                   help="per-step token budget (default: the profile's)")
    p.add_argument(
        "--kv-tier-bytes", default="0",
        help="a KV tier on disk of this size per node (e.g. 4GiB; 0: "
        "none), read back at the profile's disk rate")
    p.add_argument("--nodes", type=int, default=S.nodes, help="engine nodes behind the router")
    p.add_argument("--policy", default=S.policy, choices=list(POLICIES),
                   help="the router's policy for fleets")
    p.add_argument("--deadline-ms", type=float, default=ClientConfig.deadline_ms,
                   help="editor client first-token deadline")
    p.add_argument(
        "--tokenizer", default=S.tokenizer, choices=["auto", "model", "chars"],
        help="how prompts become tokens: the profile's model's tokenizer, or ~4 characters a token")
    p.add_argument(
        "--sweep", choices=SWEEPS, help="pool size | token budget | weights dtype | nodes x policy "
        "(--fleet: the fewest nodes for --target-goodput) | replicas (--fleet: agreement) | "
        "developers "
        "(how many one node holds at --capacity-goodput with TTFT p50 inside the deadline) | "
        "kv-tier "
        "(the disk tier's size: the smallest that keeps the best goodput)")
    p.add_argument(
        "--capacity-goodput", type=float, default=S.capacity_goodput, help=
        "--sweep developers: the editor goodput a node must keep (default: 95%% of the best "
        "count's: "
        "a burst's cold first prompt caps goodput below 1 on a CPU whatever the load)")
    p.add_argument(
        "--calibrate", action="store_true", help="fit the --profile's step-time model to the real "
        "engine on this machine and save it (then simulate with it)")
    p.add_argument("--json", dest="json_path", help="write the summary (and samples) to this file")
    p.add_argument(
        "--plot",
        help="PNG (sweeps: the sweep's curves; else pool use and resident sessions over time)")
    add_fleet_arguments(p)


def build_trace(args, profile: Profile) -> Trace:
    if args.trace:
        return Trace.load(args.trace)
    agent = None
    if profile.name.startswith("h100"):
        # long agent contexts at GPU scale, mostly identical turn to turn
        agent = AgentParams(start_tokens=40_000, max_context_tokens=60_000)
    return make_trace(args.workload, args.sessions, args.duration, args.seed, args.rate,
                      agent=agent)


def simulate(trace: Trace, profile: Profile, tokenize, dtype: str, num_blocks: int, budget: int,
             nodes: int = S.nodes, policy: str = S.policy, client: ClientConfig | None = None,
             tier_bytes: int = 0) -> tuple[dict, Driver]:
    cost = profile.cost[dtype]

    def tier() -> SimTier | None:
        return SimTier(tier_bytes, profile.kv_block_bytes,
                       profile.disk_read_bytes_per_s) if tier_bytes else None

    backends = [
        SimBackend(cost, num_blocks, profile.block_size, budget, tier=tier()) for _ in range(nodes)
    ]
    router = Router([f"node{i}" for i in range(nodes)], policy) if nodes > 1 else None
    driver = Driver(trace, backends, tokenize, client, router, fim=profile.fim,
                    suffix_tokens=profile.fim_suffix_tokens)
    t = time.perf_counter()
    driver.run()
    return summarize(driver, time.perf_counter() - t), driver


def holds(by_developers: dict[int, dict], goodput: float, p50_s: float) -> int | None:
    """The most developers whose run keeps editor goodput and TTFT p50 inside the targets (a smaller
    count that misses is its short trace's luck, not the box's capacity: fewer developers are less
    load)."""
    ok = [n for n, s in by_developers.items() if s.get("editor_goodput") is not None
          and s["editor_goodput"] >= goodput and s.get("editor_ttft_p50_s") is not None
          and s["editor_ttft_p50_s"] <= p50_s]
    return max(ok, default=None)


def run(args: argparse.Namespace) -> int:
    try:
        profile = get_profile(args.profile)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.calibrate:
        from warmpath.sim.calibrate import calibrate

        if profile.model_spec is None:
            print(
                f"error: {profile.name} is a paper profile: there is no model here to calibrate it "
                "on",
                file=sys.stderr)
            return 2
        cost, meta = calibrate(profile.model_spec, profile.calibrate_dtype)
        path = save_calibration(profile.name, cost, meta)
        print(
            f"calibrated {profile.name}: {cost}\n  median step-time error "
            f"{100 * meta['median_relative_error']:.1f}%, max "
            f"{100 * meta['max_relative_error']:.1f}% over "
            f"{len(meta['samples'])} shapes; resident weights {meta['weight_bytes'] / 1e6:.0f} MB; "
            f"saved {path}"
        )
        profile = get_profile(args.profile)  # now with the fit
    if args.kv_cache_dtype:
        # the pool's blocks and the tier's bytes per block (step times: the profile's fit)
        profile = replace(profile, kv_dtype=args.kv_cache_dtype)
    dtype = args.weights_dtype or profile.default_dtype
    if dtype not in profile.cost:
        print(f"error: profile {profile.name} has weights dtypes {', '.join(profile.cost)}",
              file=sys.stderr)
        return 2
    blocks = args.num_kv_blocks or profile.num_kv_blocks(dtype)
    budget = args.max_num_batched_tokens or profile.max_num_batched_tokens
    t = time.perf_counter()
    trace = build_trace(args, profile)
    tokenize = tokenizer_for(profile, args.tokenizer)
    client = replace(ClientConfig(), deadline_ms=args.deadline_ms)
    print(
        f"{profile.name} ({profile.sources.get('cost', 'paper profile')}); {args.workload} trace, "
        f"{len(trace.sessions)} sessions, {trace.meta.get('duration_s')} s simulated "
        f"(built in {time.perf_counter() - t:.1f} s); weights {dtype}, {blocks} KV blocks x "
        f"{profile.block_size} "
        f"tokens per node, budget {budget} tokens/step", file=sys.stderr)
    if args.fleet:
        return run_fleet(args, profile, trace, tokenize, dtype, blocks, budget, client)
    if args.sweep == "replicas":
        print("error: --sweep replicas needs --fleet", file=sys.stderr)
        return 2
    runs: list[tuple[str, dict]] = []
    tier_bytes = parse_bytes(args.kv_tier_bytes) if args.kv_tier_bytes not in ("", "0") else 0
    if not args.sweep:
        s, driver = simulate(trace, profile, tokenize, dtype, blocks, budget, args.nodes,
                             args.policy, client, tier_bytes)
        runs.append((f"{args.nodes} node(s), {args.policy}" if args.nodes > 1 else profile.name, s))
        if args.plot:
            from warmpath.sim.plot import plot_timeline

            plot_timeline(driver, args.plot, f"warmpath simulate: {profile.name}, {args.workload}, "
                                             f"{len(trace.sessions)} sessions")
    elif args.sweep == "pool":
        for f in (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1, 2):
            n = max(16, int(blocks * f))
            runs.append(
                (f"{n} blocks", simulate(trace, profile, tokenize, dtype, n, budget,
                                         client=client)[0]))
    elif args.sweep == "budget":
        for b in (64, 128, 256, 512, 1024, 2048):
            runs.append(
                (f"budget {b}", simulate(trace, profile, tokenize, dtype, blocks, b,
                                         client=client)[0]))
    elif args.sweep == "dtype":
        for d in profile.cost:
            n = profile.num_kv_blocks(d)
            runs.append(
                (f"{d} ({n} blocks)", simulate(trace, profile, tokenize, d, n, budget,
                                               client=client)[0]))
    elif args.sweep == "developers":
        if args.trace:
            print("error: --sweep developers builds its own traces (not with --trace)",
                  file=sys.stderr)
            return 2
        for n in DEVELOPERS:
            t = make_trace(args.workload, n, args.duration, args.seed, args.rate)
            runs.append((f"{n} developers",
                         simulate(t, profile, tokenize, dtype, blocks, budget, client=client)[0]))
    elif args.sweep == "kv-tier":
        for gib in KV_TIER_GIB:
            s = simulate(trace, profile, tokenize, dtype, blocks, budget, client=client,
                         tier_bytes=int(gib * 2**30))[0]
            runs.append((f"tier {gib} GiB" if gib else "no tier", s))
    elif args.sweep == "nodes":
        for n_nodes in (2, 4, 8):
            for pol in ("round-robin", "least-load", "prefix", "session", "hybrid"):
                s = simulate(trace, profile, tokenize, dtype, blocks, budget, n_nodes, pol,
                             client)[0]
                runs.append((f"{n_nodes} x {pol}", s))
    names, summaries = [n for n, _ in runs], [s for _, s in runs]
    print(table(summaries, names))
    held = None
    if args.sweep == "developers":
        best = max((s["editor_goodput"] or 0.0) for s in summaries)
        target = (args.capacity_goodput if args.capacity_goodput is not None else
                  S.target_share * best)
        held = holds(dict(zip(DEVELOPERS, summaries, strict=True)), target, args.deadline_ms / 1000)
        print(
            f"one node holds {held or 0} developer(s) at editor goodput >= {100 * target:.1f}% "
            f"({'asked' if args.capacity_goodput is not None else f'{S.target_share:.0%} of the best count'}"  # noqa: E501
            f") and TTFT p50 <= {args.deadline_ms:.0f} ms ({profile.name}, {args.duration:.0f} s, "
            f"rate {args.rate})"
        )
    if args.sweep == "kv-tier":
        best = max((s["editor_goodput"] or 0.0) for s in summaries)
        enough = next(gib for gib, s in zip(KV_TIER_GIB, summaries, strict=True)
                      if (s["editor_goodput"] or 0.0) >= S.target_share * best)
        print(
            f"a KV tier of {enough} GiB per node keeps editor goodput within {S.target_share:.0%} "
            "of the best "
            f"({len(trace.sessions)} sessions, {blocks} RAM blocks per node, disk read at "
            f"{profile.disk_read_bytes_per_s / 1e6:.0f} MB/s)")
    if args.sweep and args.plot:
        from warmpath.sim.plot import plot_sweep

        plot_sweep(
            args.sweep, names, summaries, args.plot, f"warmpath simulate --sweep {args.sweep}: "
            f"{profile.name}, {args.workload}, {len(trace.sessions)} sessions, "
            f"{trace.meta.get('duration_s')} s"
        )
    if args.plot:
        print(f"wrote {args.plot}")
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        report = {
            "command": " ".join(["warmpath", "simulate", *sys.argv[2:]]), "profile": profile.name,
            "sources": profile.sources, "cost": {d: asdict(c)
                                                 for d, c in profile.cost.items()},
            "trace": trace.meta, "runs": dict(zip(names, summaries, strict=True))
        }
        if args.sweep == "developers":
            report["holds_developers"], report["capacity_goodput"] = held or 0, target
        Path(args.json_path).write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {args.json_path}")
    return 0
