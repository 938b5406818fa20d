"""Soak: mixed editor + agent traffic through `warmpath route` to two `warmpath serve` nodes for --minutes, with
clients that give up at random (mid-prefill, mid-stream) and a node restarted halfway (drained through the
admin API first, as an operator would). Every --sample-every seconds it records each process's RSS, open file
descriptors and threads, each node's KV blocks in use and requests running / waiting, and the router's
requests in flight; at the end, with the traffic stopped, the same once more (KV blocks held must be 0).
Writes JSON and a PNG plot; prints the table. Loopback only.

    python benchmarks/soak.py --minutes 30 [--editors 4 --agents 1 --model smollm2]

Client-visible errors are answers a client did not ask to lose: a 5xx, an error event in a stream, a
connection error. Disconnects are the client's own doing and counted apart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from warmpath.workloads import stdlib_files

sys.path.insert(0, str(Path(__file__).parent))
from common import machine, write_json  # noqa: E402

BIN = Path(sys.executable).parent
ADMIN_KEY = "soak-admin"


def start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "warmpath"), "--log-level", "warning", *args], stdout=log.open("ab"),
                            stderr=subprocess.STDOUT)


def wait_ready(url: str, proc: subprocess.Popen, limit_s: float = 300) -> None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {limit_s} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


class Fleet:
    def __init__(self, a):
        self.a, self.logs = a, Path(a.logs)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.ports = [a.base_port + i for i in range(2)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.router_url = f"http://127.0.0.1:{a.base_port + 10}"
        self.nodes = [self.start_node(i) for i in range(2)]
        for url, proc in zip(self.urls, self.nodes, strict=True):
            wait_ready(url, proc)
        self.router = start(["route", "--port", str(self.a.base_port + 10), "--health-interval", "0.5",
                             "--admin-key", ADMIN_KEY, *(x for u in self.urls for x in ("--node", u))],
                            self.logs / "router.log")
        wait_ready(self.router_url, self.router)
        self.restarts = 0

    def start_node(self, i: int) -> subprocess.Popen:
        return start(["serve", "--port", str(self.ports[i]), "--model", self.a.model, "--num-threads",
                      str(self.a.threads), "--num-kv-blocks", str(self.a.node_blocks)], self.logs / f"node{i}.log")

    async def restart(self, i: int, http: httpx.AsyncClient) -> None:
        """Drain node i, wait for its streams to finish (bounded), stop it, start it again, take it back."""
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        await http.post(f"{self.router_url}/admin/nodes/drain", json={"node": self.urls[i]}, headers=admin)
        end = time.monotonic() + 60
        while time.monotonic() < end and (await self.in_flight(http)).get(self.urls[i], 0):
            await asyncio.sleep(0.2)
        await asyncio.to_thread(stop, self.nodes[i])
        self.nodes[i] = self.start_node(i)
        await asyncio.to_thread(wait_ready, self.urls[i], self.nodes[i])
        await http.post(f"{self.router_url}/admin/nodes/undrain", json={"node": self.urls[i]}, headers=admin)
        self.restarts += 1

    async def in_flight(self, http: httpx.AsyncClient) -> dict[str, int]:
        nodes = (await http.get(f"{self.router_url}/health", timeout=5)).json()["nodes"]
        return {n["url"]: n["in_flight"] for n in nodes}

    def close(self) -> None:
        for p in [self.router, *self.nodes]:
            stop(p)


GAUGES = ("warmpath_kv_cache_usage_ratio", "warmpath_num_requests_running", "warmpath_num_requests_waiting")


async def sample(fleet: Fleet, http: httpx.AsyncClient, t0: float) -> dict:
    row = {"t": round(time.monotonic() - t0, 1), "procs": {}, "nodes": {}}
    for name, proc in [("router", fleet.router), *((f"node{i}", p) for i, p in enumerate(fleet.nodes))]:
        try:
            p = psutil.Process(proc.pid)
            row["procs"][name] = {"rss_mb": round(p.memory_info().rss / 1e6, 1), "fds": p.num_fds(),
                                  "threads": p.num_threads()}
        except psutil.Error:
            row["procs"][name] = None
    for i, url in enumerate(fleet.urls):
        try:
            text = (await http.get(f"{url}/metrics", timeout=5)).text
            g = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(warmpath_\w+) (\S+)$", text, re.M)}
            row["nodes"][f"node{i}"] = {"kv_blocks_used": round(g[GAUGES[0]] * fleet.a.node_blocks),
                                        "running": g[GAUGES[1]], "waiting": g[GAUGES[2]]}
        except (httpx.HTTPError, KeyError):
            row["nodes"][f"node{i}"] = None  # restarting
    try:
        row["router_in_flight"] = sum((await fleet.in_flight(http)).values())
    except httpx.HTTPError:
        row["router_in_flight"] = None
    return row


class Traffic:
    """Editors (short prompts cut from real files, 16 tokens, a 3 s deadline) and agents (long chat contexts that
    grow, 64 tokens); a share of requests abandoned by their client at a random moment."""

    def __init__(self, fleet: Fleet, a, texts: list[str]):
        self.fleet, self.a, self.texts = fleet, a, texts
        self.counts = {"sent": 0, "ok": 0, "disconnected": 0, "silence": 0, "errors": 0}
        self.error_samples: list[str] = []

    def _error(self, what: str) -> None:
        self.counts["errors"] += 1
        if len(self.error_samples) < 20:
            self.error_samples.append(what[:300])

    async def one(self, http: httpx.AsyncClient, path: str, body: dict, headers: dict, rng: random.Random) -> None:
        self.counts["sent"] += 1
        give_up = rng.random() < self.a.disconnect_share
        try:
            async with asyncio.timeout(rng.uniform(0.05, 1.5) if give_up else None):
                async with http.stream("POST", self.fleet.router_url + path, json=body, headers=headers) as r:
                    if r.status_code != 200:
                        body_text = (await r.aread()).decode(errors="replace")
                        return self._error(f"HTTP {r.status_code}: {body_text}")
                    finish = None
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            event = json.loads(line[6:])
                            if "error" in event:
                                return self._error(f"error event: {line}")
                            for c in event.get("choices") or []:
                                finish = c.get("finish_reason") or finish
            self.counts["silence" if finish in ("deadline", "overloaded") else "ok"] += 1
        except TimeoutError:
            self.counts["disconnected"] += 1
        except httpx.HTTPError as e:
            self._error(repr(e))

    async def editor(self, k: int, end: float, http: httpx.AsyncClient) -> None:
        rng = random.Random(self.a.seed * 1000 + k)
        text, start, cursor = "", 0, 0
        while time.monotonic() < end:
            cursor += rng.randint(5, 80)  # typed on
            if cursor >= len(text) or cursor - start > 4000 or rng.random() < 0.05:  # another file, or spot
                text = rng.choice(self.texts)
                cursor = rng.randint(500, max(501, len(text) - 1000))
                start = max(0, cursor - 1500)  # the window the plugin sends: its prefix stays warm while typing
            body = {"prompt": text[start:cursor], "suffix": text[cursor:cursor + 500],
                    "max_tokens": 16, "temperature": 0 if rng.random() < 0.7 else 0.8, "stream": True}
            await self.one(http, "/v1/completions", body, {"X-Session-Id": f"dev-{k}", "X-Deadline-Ms": "3000"}, rng)
            await asyncio.sleep(rng.uniform(0.2, 2.0) * self.a.think)

    async def agent(self, k: int, end: float, http: httpx.AsyncClient) -> None:
        rng = random.Random(self.a.seed * 1000 + 500 + k)
        while time.monotonic() < end:
            context = rng.choice(self.texts)[:2000]
            for _turn in range(rng.randint(3, 8)):
                if time.monotonic() >= end:
                    return
                messages = [{"role": "system", "content": "You are a coding agent."},
                            {"role": "user", "content": f"Fix the bug in this file:\n{context}"}]
                body = {"messages": messages, "max_tokens": 64, "stream": True, "temperature": 0.7}
                await self.one(http, "/v1/chat/completions", body, {"X-Session-Id": f"agent-{k}"}, rng)
                context += "\n# tool output\n" + rng.choice(self.texts)[:rng.randint(200, 800)]
                await asyncio.sleep(rng.uniform(1.0, 4.0) * self.a.think)


async def soak(a) -> dict:
    texts = [p.read_text(errors="replace") for p in stdlib_files()[:200]]
    fleet = Fleet(a)
    samples = []
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=5),
                                     limits=httpx.Limits(max_connections=200)) as http:
            t0 = time.monotonic()
            end = t0 + a.minutes * 60
            traffic = Traffic(fleet, a, texts)
            clients = [asyncio.create_task(traffic.editor(k, end, http)) for k in range(a.editors)]
            clients += [asyncio.create_task(traffic.agent(k, end, http)) for k in range(a.agents)]
            restart_at, restarted = t0 + a.minutes * 60 * a.restart_at, False
            while time.monotonic() < end:
                samples.append(await sample(fleet, http, t0))
                if not restarted and time.monotonic() >= restart_at:
                    restarted = True
                    asyncio.create_task(fleet.restart(1, http))
                await asyncio.sleep(a.sample_every)
            await asyncio.gather(*clients)
            settle = time.monotonic() + 60  # in flight at the end: let it finish, then the last sample
            while time.monotonic() < settle:
                last = await sample(fleet, http, t0)
                nodes = [n for n in last["nodes"].values() if n]
                if last["router_in_flight"] == 0 and all(n["kv_blocks_used"] == 0 for n in nodes):
                    break
                await asyncio.sleep(1)
            samples.append(await sample(fleet, http, t0))
    finally:
        fleet.close()
    return {"samples": samples, "counts": traffic.counts, "error_samples": traffic.error_samples,
            "restarts": fleet.restarts}


def summarize(result: dict) -> dict:
    samples, summary = result["samples"], {}
    for name in samples[0]["procs"]:
        rows = [s["procs"][name] for s in samples if s["procs"].get(name)]
        summary[name] = {k: {"start": rows[0][k], "end": rows[-1][k], "max": max(r[k] for r in rows)}
                         for k in ("rss_mb", "fds", "threads")}
    final = samples[-1]
    summary["end"] = {"kv_blocks_used": {n: v and v["kv_blocks_used"] for n, v in final["nodes"].items()},
                      "router_in_flight": final["router_in_flight"]}
    return summary


def table(result: dict) -> str:
    s, lines = result["summary"], ["| process | RSS MB start / end / max | fds start / end / max | "
                                   "threads start / end / max |", "|---|---|---|---|"]
    for name, v in s.items():
        if name == "end":
            continue
        lines.append(f"| {name} | " + " | ".join(f"{v[k]['start']} / {v[k]['end']} / {v[k]['max']}"
                                                  for k in ("rss_mb", "fds", "threads")) + " |")
    c = result["counts"]
    lines.append(f"\n{result['minutes']} min, node restarts {result['restarts']}; requests {c['sent']}: ok {c['ok']},"
                 f" silence {c['silence']}, client disconnects {c['disconnected']}, client-visible errors "
                 f"{c['errors']}; at the end: KV blocks held {s['end']['kv_blocks_used']}, router in flight "
                 f"{s['end']['router_in_flight']}")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    t = [s["t"] / 60 for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    for ax, key, label in zip(axes[:3], ("rss_mb", "fds", "threads"), ("RSS (MB)", "open fds", "threads"),
                              strict=True):
        for name in samples[0]["procs"]:
            ax.plot(t, [(s["procs"].get(name) or {}).get(key) for s in samples], label=name)
        ax.set_ylabel(label)
        ax.legend(loc="upper left", fontsize=8)
    ax = axes[3]
    for name in samples[0]["nodes"]:
        ax.plot(t, [(s["nodes"].get(name) or {}).get("kv_blocks_used") for s in samples], label=f"{name} KV blocks")
    ax.plot(t, [s["router_in_flight"] for s in samples], label="router in flight", linestyle="--")
    ax.set_ylabel("KV blocks / requests")
    ax.set_xlabel("minutes")
    ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"soak: {result['minutes']} min, editors {result['editors']}, agents {result['agents']}, "
                 f"restarts {result['restarts']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--editors", type=int, default=4)
    p.add_argument("--agents", type=int, default=1)
    p.add_argument("--think", type=float, default=1.0, help="scales every client's pause between requests")
    p.add_argument("--disconnect-share", type=float, default=0.2, help="requests the client abandons")
    p.add_argument("--restart-at", type=float, default=0.5, help="share of the run at which node 1 restarts")
    p.add_argument("--sample-every", type=float, default=5.0)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--threads", type=int, default=1, help="per node")
    p.add_argument("--node-blocks", type=int, default=1024)
    p.add_argument("--base-port", type=int, default=18300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--logs", default="/tmp/warmpath-soak")
    p.add_argument("--out", default="benchmarks/results/soak.json")
    p.add_argument("--plot", default="benchmarks/results/soak.png")
    a = p.parse_args()
    result = asyncio.run(soak(a))
    result.update(minutes=a.minutes, editors=a.editors, agents=a.agents, model=a.model, machine=machine(),
                  disconnect_share=a.disconnect_share)
    result["summary"] = summarize(result)
    write_json(a.out, result)
    plot(result, a.plot)
    print(table(result))
    if result["error_samples"]:
        print("errors, first few:\n  " + "\n  ".join(result["error_samples"]))


if __name__ == "__main__":
    main()
