"""`warmpath simulate --fleet`: N nodes behind R router replicas, optionally losing a node; one run,
the fewest nodes for a goodput target (`--sweep nodes`), or replica agreement against the number of
replicas (`--sweep replicas`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from warmpath.config import ClientConfig, RouterConfig, SimConfig
from warmpath.sim.backends import SimBackend
from warmpath.sim.capacity import fewest_nodes
from warmpath.sim.fleet import REPLICA_BY, FleetDriver, FleetSpec
from warmpath.sim.fleet_report import fleet_summary, fleet_table
from warmpath.sim.profiles import Profile
from warmpath.workloads import Trace

REPLICA_SWEEP = (1, 2, 3, 5, 8)


def add_fleet_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fleets (--fleet)")
    g.add_argument(
        "--fleet", action="store_true", help="N nodes behind R router replicas, each with its own "
        "counts and scrapes (--sweep nodes: the fewest nodes for --target-goodput; --sweep "
        "replicas)"
    )
    g.add_argument("--replicas", type=int, default=SimConfig.replicas,
                   help="router replicas in front of the nodes")
    g.add_argument("--replica-by", default=SimConfig.replica_by, choices=list(REPLICA_BY),
                   help="how the balancer in front spreads requests over the replicas")
    g.add_argument("--scrape-s", type=float, default=RouterConfig.health_interval,
                   help="simulated seconds between a replica's scrapes of the nodes' /metrics")
    g.add_argument("--affinity-floor", type=int, default=RouterConfig.affinity_floor,
                   help="a node keeps its sessions while its load is under this many requests")
    g.add_argument("--kill-node-at", type=float, help="simulated second at which one node dies")
    g.add_argument("--kill-node", type=int,
                   help="which node (default: the one most sessions call home then)")
    g.add_argument(
        "--target-goodput", type=float, default=SimConfig.target_goodput,
        help=f"--sweep nodes: editor goodput to keep (default: {SimConfig.target_share:.0%}% of "
             "what "
        "--nodes nodes get)")
    g.add_argument("--router-busy", type=float, default=SimConfig.router_busy,
                   help="share of its core a router replica may use at the peak")


def spec_from(args: argparse.Namespace, replicas: int | None = None) -> FleetSpec:
    return FleetSpec(replicas=replicas or args.replicas, replica_by=args.replica_by,
                     policy=args.policy, scrape_s=args.scrape_s, floor=args.affinity_floor,
                     kill_at=args.kill_node_at, kill_node=args.kill_node)


def simulate_fleet(trace: Trace, profile: Profile, tokenize, dtype: str, num_blocks: int,
                   budget: int, nodes: int, spec: FleetSpec, client: ClientConfig | None = None,
                   router_busy: float | None = None) -> tuple[dict, FleetDriver]:
    cost = profile.cost[dtype]
    backends = [SimBackend(cost, num_blocks, profile.block_size, budget) for _ in range(nodes)]
    driver = FleetDriver(trace, backends, tokenize, client, spec, fim=profile.fim,
                         suffix_tokens=profile.fim_suffix_tokens)
    t = time.perf_counter()
    driver.run()
    return fleet_summary(driver, time.perf_counter() - t, router_busy=router_busy), driver


def run_fleet(args: argparse.Namespace, profile: Profile, trace: Trace, tokenize, dtype: str,
              blocks: int, budget: int, client: ClientConfig) -> int:
    def one(nodes: int, replicas: int | None = None) -> dict:
        s = simulate_fleet(trace, profile, tokenize, dtype, blocks, budget, nodes,
                           spec_from(args, replicas), client, args.router_busy)[0]
        print(
            f"  {nodes} nodes x {s['replicas']} replicas: editor goodput "
            f"{100 * (s['editor_goodput'] or 0):.1f}%, "
            f"hit rate {100 * (s['prefix_hit_rate'] or 0):.1f}% ({s['wall_s']:.0f} s)",
            file=sys.stderr)
        return s

    extra: dict = {}
    if args.sweep == "nodes":
        target, first = args.target_goodput, {}
        if target is None:
            first[args.nodes] = one(args.nodes)
            target = SimConfig.target_share * (first[args.nodes]["editor_goodput"] or 0.0)
        best, probes = fewest_nodes(one, target, args.nodes, probes=first)
        names = [f"{n} nodes" for n in sorted(probes)]
        summaries = [probes[n] for n in sorted(probes)]
        extra = {"target_goodput": target, "fewest_nodes": best}
        print(
            f"fewest nodes keeping editor goodput >= {100 * target:.1f}% for "
            f"{len(trace.sessions)} developers: "
            f"{best if best is not None else f'more than {4 * args.nodes}'}"
        )
    elif args.sweep == "replicas":
        summaries = [one(args.nodes, r) for r in REPLICA_SWEEP]
        names = [f"{r} replicas" for r in REPLICA_SWEEP]
    elif args.sweep:
        print(f"error: --fleet sweeps nodes or replicas, not {args.sweep}", file=sys.stderr)
        return 2
    else:
        summaries, names = [one(args.nodes)], [f"{args.nodes} nodes x {args.replicas} replicas"]
    print(fleet_table(summaries, names))
    if args.plot:
        from warmpath.sim.plot import plot_fleet

        plot_fleet(
            args.sweep, names, summaries, args.plot, f"warmpath simulate --fleet: {profile.name}, "
            f"{args.workload}, {len(trace.sessions)} developers, {trace.meta.get('duration_s')} s",
            extra.get("target_goodput"))
        print(f"wrote {args.plot}")
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        report = {
            "command": " ".join(["warmpath", "simulate", *sys.argv[2:]]), "profile": profile.name,
            "sources": profile.sources, "cost": asdict(profile.cost[dtype]),
            "kv_blocks_per_node": blocks, "trace": trace.meta,
            **extra, "runs": dict(zip(names, summaries, strict=True))
        }
        Path(args.json_path).write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {args.json_path}")
    return 0
