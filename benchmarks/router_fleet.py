"""Three real `warmpath serve` nodes (bundled model) behind `warmpath route`, one editor trace, side
by side in one run, each phase on fresh nodes (empty caches):

  one-big-node   one node with the three nodes' KV blocks together, no router (the hit rate to keep)
  hybrid         the router's default policy (every editor request carries its session key)
  round-robin    the baseline that throws warm prefixes away hybrid + kill  the hybrid run again;
  one node is SIGKILLed at --kill-at of the run, restarted at --back-at

and, first, the router's own overhead: TTFT of the same warm requests direct to a node and through
the router, interleaved. Prints tables, writes benchmarks/results/router_fleet.json.

    python benchmarks/router_fleet.py [--developers 12 --duration 240 --rate 10 --node-blocks 400]

Three nodes and the client share this machine's cores, so absolute TTFTs are far above a real
fleet's; the hit rates and where each session was served are what the run is for.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from warmpath.bench.report import SLO, percentile, summarize, table
from warmpath.bench.runner import replay
from warmpath.bench.scrape import delta, scrape
from warmpath.client.completion import ERROR, RequestRecord, Target, stream_completion
from warmpath.client.editor import ClientConfig
from warmpath.router.hashing import HashRing
from warmpath.workloads import make_trace

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
BASE_PORT = 8300
ADMIN_KEY = "router-fleet"


def start_node(port: int, blocks: int, threads: int, log: Path) -> subprocess.Popen:
    cmd = [
        str(BIN / "warmpath"), "serve", "--model", "smollm2", "--port",
        str(port), "--num-kv-blocks",
        str(blocks), "--num-threads",
        str(threads), "--dtype", "float32"
    ]
    return subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def start_router(port: int, nodes: list[str], policy: str, log: Path, *extra:
                 str) -> subprocess.Popen:
    cmd = [
        str(BIN / "warmpath"), "route", "--port",
        str(port), "--policy", policy, "--health-interval", "0.5",
        *(a for n in nodes for a in ("--node", n)), *extra
    ]
    return subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def wait_ready(url: str, proc: subprocess.Popen, path: str = "/health",
               limit_s: float = 300) -> None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with {proc.returncode}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {limit_s} s")


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


class Fleet:
    """Fresh nodes (and optionally a router) for one phase."""

    def __init__(self, n: int, blocks: int, threads: int, logs: Path):
        self.ports = [BASE_PORT + i for i in range(n)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.blocks, self.threads, self.logs = blocks, threads, logs
        self.nodes = [start_node(p, blocks, threads, logs / f"node{p}.log") for p in self.ports]
        for url, proc in zip(self.urls, self.nodes, strict=True):
            wait_ready(url, proc)
        self.router: subprocess.Popen | None = None

    def route(self, policy: str, *extra: str) -> str:
        self.router = start_router(BASE_PORT + 99, self.urls, policy, self.logs / "router.log",
                                   "--admin-key", ADMIN_KEY, *extra)
        self.router_url = f"http://127.0.0.1:{BASE_PORT + 99}"
        wait_ready(self.router_url, self.router)
        return self.router_url

    def kill(self, i: int) -> None:
        self.nodes[i].send_signal(signal.SIGKILL)
        self.nodes[i].wait()

    def restart(self, i: int) -> None:
        self.nodes[i] = start_node(self.ports[i], self.blocks, self.threads,
                                   self.logs / f"node{self.ports[i]}.log")

    def close(self) -> None:
        stop([*self.nodes, *([self.router] if self.router else [])])


# -- router overhead -------------------------------------------------------------------------------
async def overhead(node: str, router: str, n: int) -> dict:
    """The same short warm request (a fixed 200-token-ish prefix + a varying last line), alternately
    direct and through the router; TTFT of each, medians compared."""
    prefix = (ROOT / "warmpath" / "router" / "hashing.py").read_text()[:800]
    async with httpx.AsyncClient(timeout=60) as http:
        times: dict[str, list[float]] = {"direct": [], "router": []}
        for i in range(n + 2):
            for name, url in (("direct", node), ("router", router)):
                rec = RequestRecord("overhead", "editor", 0.0)
                t0 = time.monotonic()
                body = {"prompt": prefix + f"\n# {i} {name}\n", "max_tokens": 1, "temperature": 0}
                await stream_completion(http, Target(url), body, rec,
                                        lambda t0=t0: time.monotonic() - t0, session="overhead")
                if i >= 2 and rec.ttft is not None:  # the first two warm the prefix on both paths
                    times[name].append(rec.ttft)
    d, r = statistics.median(times["direct"]), statistics.median(times["router"])
    return {
        "requests_each": len(times["direct"]), "direct_ttft_p50_ms": d * 1000,
        "router_ttft_p50_ms": r * 1000, "added_ms_p50": (r - d) * 1000,
        "direct_ttft_p90_ms": percentile(times["direct"], 90) * 1000,
        "router_ttft_p90_ms": percentile(times["router"], 90) * 1000
    }


# -- the kill run's analysis -----------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--developers", type=int, default=12)
    ap.add_argument("--duration", type=float, default=240)
    ap.add_argument("--rate", type=float, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--node-blocks", type=int, default=400, help="KV blocks of 16 tokens per node")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per node")
    ap.add_argument(
        "--deadline-ms", type=float, default=1500, help=
        "client first-token deadline (the editor default is 300; on 2 shared cores every request "
        "would be censored at it, so TTFT percentiles are measured against a longer one)")
    ap.add_argument("--phases", default="overhead,one-big-node,hybrid,round-robin,kill")
    ap.add_argument("--kill-at", type=float, default=0.25,
                    help="share of the run when node 1 is killed")
    ap.add_argument("--back-at", type=float, default=0.5,
                    help="share of the run when it is restarted")
    ap.add_argument("--json", default="benchmarks/results/router_fleet.json")
    args = ap.parse_args()
    phases = args.phases.split(",")
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"router_fleet_{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    trace = make_trace("editor", args.developers, args.duration, args.seed, args.rate)
    # else the editor defaults: debounce 75 ms, 16 tokens, FIM
    cfg = ClientConfig(deadline_ms=args.deadline_ms)
    slo = SLO()
    keys = sum(e["type"] == "key" for e in trace.events)
    print(
        f"trace: {args.developers} developers, {args.duration:.0f} s, idle x{args.rate}, seed "
        f"{args.seed}: "
        f"{keys} keystrokes; {args.nodes} nodes x {args.node_blocks} KV blocks, {args.threads} "
        "thread(s) each; "
        f"logs in {logs}", file=sys.stderr)
    out: dict = {
        "command": " ".join(["python", "benchmarks/router_fleet.py", *sys.argv[1:]]),
        "args": vars(args), "trace": trace.meta, "summaries": {}, "machine": os.uname().machine
    }
    runs: dict[str, object] = {}

    if "overhead" in phases:
        fleet = Fleet(1, args.node_blocks, max(1, os.cpu_count() or 1), logs)
        try:
            router = fleet.route("hybrid", "--cache-entries", "0")
            out["overhead"] = asyncio.run(overhead(fleet.urls[0], router, 40))
            print(f"overhead: {out['overhead']}", file=sys.stderr)
        finally:
            fleet.close()

    def run_phase(name: str, policy: str | None, chaos=None) -> None:
        n = 1 if policy is None else args.nodes
        blocks = args.node_blocks * args.nodes if policy is None else args.node_blocks
        fleet = Fleet(n, blocks, args.threads, logs)
        try:
            # the response cache off: this run compares where requests go (KV prefix hits), not
            # repeats answered
            url = fleet.urls[0] if policy is None else fleet.route(policy, "--cache-entries", "0")

            async def go():
                tasks = [replay(trace, Target(url), cfg, label=name)]
                if chaos:
                    tasks.append(chaos(fleet))
                return (await asyncio.gather(*tasks))[0]
            runs[name] = asyncio.run(go())
            runs[name].extra["nodes"] = fleet.urls
        finally:
            fleet.close()

    if "one-big-node" in phases:
        run_phase("one-big-node", None)
    if "hybrid" in phases:
        run_phase("hybrid", "hybrid")
    if "round-robin" in phases:
        run_phase("round-robin", "round-robin")
    kill_at, back_at = args.duration * args.kill_at, args.duration * args.back_at
    if "kill" in phases:
        events: dict[str, float] = {}

        counters: dict[str, dict] = {}
        # (t, session, node) for every request the router placed
        routed: list[tuple[float, str, str]] = []

        async def watch_sessions(http: httpx.AsyncClient, url: str, t0: float) -> None:
            """Poll the router's session map: a session whose request count grew was routed to its
            node."""
            seen: dict[str, int] = {}
            while True:
                try:
                    r = await http.get(url + "/admin/sessions",
                                       headers={"Authorization": f"Bearer {ADMIN_KEY}"})
                    for session, entry in r.json()["sessions"].items():
                        if entry["requests"] > seen.get(session, 0):
                            routed.append((time.monotonic() - t0, session, entry["node"]))
                        seen[session] = entry["requests"]
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                await asyncio.sleep(0.25)

        async def chaos(fleet: Fleet) -> None:
            """Kill node 1 at kill_at, restart it at back_at; the fleet's prefix counters (through
            the router, restart-safe) are read at each boundary so the hit rate is known per
            window."""
            t0 = time.monotonic()
            async with httpx.AsyncClient() as http:
                watcher = asyncio.create_task(watch_sessions(http, fleet.router_url, t0))
                target = Target(fleet.router_url)
                counters["start"] = await scrape(http, target)
                await asyncio.sleep(kill_at)
                counters["killed"] = await scrape(http, target)
                fleet.kill(1)
                events["killed"] = time.monotonic() - t0
                await asyncio.sleep(back_at - kill_at)
                counters["restarting"] = await scrape(http, target)
                fleet.restart(1)
                await asyncio.to_thread(wait_ready, fleet.urls[1], fleet.nodes[1])
                events["back"] = time.monotonic() - t0
                counters["back"] = await scrape(http, target)
                await asyncio.sleep(max(0.0, args.duration - (time.monotonic() - t0)))
                counters["end"] = await scrape(http, target)
                watcher.cancel()
        run_phase("hybrid+kill", "hybrid", chaos)
        out["kill"] = {"victim": runs["hybrid+kill"].extra["nodes"][1], **events}

        def window_rate(a: str, b: str) -> float | None:
            d = delta(counters.get(a), counters.get(b))
            return d["prefix_hit_tokens"] / d["prefix_queried_tokens"] if d.get(
                "prefix_queried_tokens") else None
        out["kill"]["fleet_hit_rate"] = {"before the kill": window_rate("start", "killed"),
                                         "node down": window_rate("killed", "restarting"),
                                         "restarted (loading)": window_rate("restarting", "back"),
                                         "back": window_rate("back", "end")}

    names = list(runs)
    summaries = [summarize(runs[n], slo) for n in names]
    print()
    print(table(summaries, names, cfg.deadline_ms, markdown=True))
    out["summaries"] = dict(zip(names, summaries, strict=True))
    for name in names:
        out.setdefault("records", {})[name] = [{
            "session": r.session, "sent": round(r.sent, 3), "ttft": r.ttft, "outcome": r.outcome,
            "node": r.node, "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
            "error": r.error
        } for r in runs[name].records]

    if "kill" in phases:
        recs = runs["hybrid+kill"].records
        victim, nodes = out["kill"]["victim"], runs["hybrid+kill"].extra["nodes"]
        killed, back = out["kill"]["killed"], out["kill"]["back"]
        # the router notices a refused connection at once, missed health checks within 1.5 s
        windows = {
            "before": (0, killed), "down": (killed + 2, back),
            "after": (back + 2, args.duration + 60)
        }
        nodes_in: dict[str,
                       dict[str,
                            set]] = collections.defaultdict(lambda: collections.defaultdict(set))
        for t, session, node in routed:
            for w, (a, b) in windows.items():
                if a <= t < b:
                    nodes_in[session][w].add(node)
        ring = HashRing(nodes)
        victims = sorted(s for s in nodes_in if ring.home(s) == victim)
        others = sorted(s for s in nodes_in if ring.home(s) != victim)
        cut = [r for r in recs if r.finish_reason == "upstream_failed"]
        errors = [r for r in recs if r.outcome == ERROR]
        k = {
            "sessions": len(nodes_in),
            "victim_sessions": victims,
            "nodes_per_window": {
                s: {w: sorted(v)
                    for w, v in ws.items()}
                for s, ws in sorted(nodes_in.items())
            },
            "victim_sessions_on_victim_while_down": [
                s for s in victims if victim in nodes_in[s]["down"]
            ],
            "other_sessions_off_their_home": {
                w: sorted(s for s in others if nodes_in[s][w] - {ring.home(s)})
                for w in windows
            },
            "victim_sessions_back_home_after": [
                s for s in victims if nodes_in[s]["after"] == {victim}
            ],
            "victim_sessions_active_after": [s for s in victims if nodes_in[s]["after"]],
            "errors_seen_by_clients": len(errors),
            "error_examples": [r.error for r in errors[:3]],
            "suggestions_cut_mid_stream": len(cut),
            "requests_routed": len(routed),
        }
        out["kill"].update(k)
        print("\nkill one node mid-run (hybrid):")
        for key, v in out["kill"].items():
            if key != "nodes_per_window":
                print(f"  {key}: {v}")
    if "overhead" in out:
        o = out["overhead"]
        print(
            f"\nrouter overhead ({o['requests_each']} warm requests each, interleaved): TTFT p50 "
            "direct "
            f"{o['direct_ttft_p50_ms']:.1f} ms, through the router {o['router_ttft_p50_ms']:.1f} "
            "ms "
            f"(+{o['added_ms_p50']:.1f} ms); p90 {o['direct_ttft_p90_ms']:.1f} vs "
            f"{o['router_ttft_p90_ms']:.1f} ms"
        )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
