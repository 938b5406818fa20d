"""The router's own CPU per request, for `warmpath simulate --fleet`'s "how many router replicas":
one real `warmpath route` in front of one real `warmpath serve` node (bundled model), editor
requests as the editor client sends them (prompt + suffix, max_tokens 16, streamed, a session key),
the router process's CPU time (user + system, from the OS) over the run less what it spends idle
(health checks and /metrics scrapes).

`Router.choose` is timed in-process too, at 1 node and at fleet sizes: the proxy path (HTTP in,
JSON, relay) is the per-request figure less choose at 1 node; the simulator adds choose at its own
fleet size, timed live.

    python benchmarks/router_cpu.py [--requests 400 --concurrency 1,8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from router_fleet import BIN, start_node, stop, wait_ready  # noqa: E402

from warmpath.client.completion import RequestRecord, Target, stream_completion  # noqa: E402
from warmpath.router.policies import RouteKey, Router  # noqa: E402
from warmpath.workloads import editor_prompt, make_trace  # noqa: E402

NODE_PORT, ROUTER_PORT = 8390, 8391


def prompts(n: int) -> list[tuple[str, str, str]]:
    """(session, prefix, suffix) at every few keystrokes of a real-code editor trace: consecutive
    prompts of a session share their prefix, as an editor's do."""
    trace = make_trace("editor", 8, 1800, seed=7, rate=4)
    keys = [e for e in trace.events if e["type"] == "key"]
    step = max(1, len(keys) // n)
    return [(k["session"], *editor_prompt(trace, k)) for k in keys[::step][:n]]


def cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


async def send_all(url: str, work: list[tuple[str, str, str]], concurrency: int) -> int:
    queue = list(reversed(work))
    done = 0

    async def worker(http: httpx.AsyncClient) -> None:
        nonlocal done
        while queue:
            session, prefix, suffix = queue.pop()
            rec = RequestRecord(session, "editor", 0.0)
            body = {"prompt": prefix, "suffix": suffix, "max_tokens": 16, "temperature": 0}
            await stream_completion(http, Target(url), body, rec, time.monotonic, session=session)
            done += rec.error is None
    async with httpx.AsyncClient(timeout=120) as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    return done


def choose_cpu(work: list[tuple[str, str, str]], nodes: int, floor: int = 4) -> float:
    """Median thread CPU seconds of one Router.choose at this many nodes (the loads as the real
    NodeSet builds them: one entry per node)."""
    names = [f"http://10.0.0.{i}:8000" for i in range(nodes)]
    router = Router(names, "hybrid", floor=floor)
    times = []
    for session, prefix, _ in work:
        t = time.thread_time()
        loads = {n: 1.0 for n in names}
        router.choose(RouteKey(session, prefix), names, loads)
        times.append(time.thread_time() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--idle-s", type=float, default=15.0)
    ap.add_argument("--json", default="benchmarks/results/router_cpu.json")
    args = ap.parse_args()
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / "router_cpu"
    logs.mkdir(parents=True, exist_ok=True)
    node = start_node(NODE_PORT, 2000, 1, logs / "node.log")
    node_url, router_url = f"http://127.0.0.1:{NODE_PORT}", f"http://127.0.0.1:{ROUTER_PORT}"
    router = None
    try:
        wait_ready(node_url, node)
        router = subprocess.Popen(
            [str(BIN / "warmpath"), "route", "--port",
             str(ROUTER_PORT), "--node", node_url], stdout=(logs / "router.log").open("ab"),
            stderr=subprocess.STDOUT)  # defaults
        wait_ready(router_url, router)
        proc = psutil.Process(router.pid)
        levels = [int(c) for c in args.concurrency.split(",")]
        # distinct prompts for every run: a repeated one would be answered from the router's
        # response cache
        every = prompts(args.requests * len(levels) + 20)
        # warm: the router's imports, its connections
        asyncio.run(send_all(router_url, every[:20], 1))
        c0, t0 = cpu(proc), time.monotonic()
        time.sleep(args.idle_s)
        idle_rate = (cpu(proc) - c0) / (time.monotonic() - t0)
        runs = {}
        for n, conc in enumerate(levels):
            work = every[20 + n * args.requests:20 + (n + 1) * args.requests]
            c0, t0 = cpu(proc), time.monotonic()
            ok = asyncio.run(send_all(router_url, work, conc))
            wall = time.monotonic() - t0
            used = cpu(proc) - c0 - idle_rate * wall
            runs[f"concurrency_{conc}"] = {
                "requests": len(work), "ok": ok, "wall_s": wall, "router_cpu_s": used,
                "cpu_per_request_s": used / len(work)
            }
            print(f"concurrency {conc}: {ok}/{len(work)} ok in {wall:.1f} s, router CPU "
                  f"{1000 * used / len(work):.2f} ms per request")
    finally:
        stop([p for p in (router, node) if p is not None])
    choose = {str(n): choose_cpu(every, n) for n in (1, 10, 30, 100, 120, 300)}
    per_request = max(r["cpu_per_request_s"] for r in runs.values())  # the dearer: plan for it
    cpu_model = Path("/proc/cpuinfo").read_text().split("model name")[1].split("\n")[0].strip(
        ": \t")
    report = {
        "command": " ".join(["python", *sys.argv]),
        "machine": f"{cpu_model}, {os.cpu_count()} cores", "python": sys.version.split()[0],
        "idle_cpu_per_s": idle_rate, "runs": runs, "choose_cpu_s_by_nodes": choose,
        "cpu_per_request_s": per_request, "proxy_path_cpu_s": per_request - choose["1"]
    }
    for n, v in choose.items():
        print(f"Router.choose at {n} nodes: {1000 * v:.3f} ms")
    print(
        f"proxy path (per request less choose at 1 node): {1000 * report['proxy_path_cpu_s']:.2f} "
        "ms"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
