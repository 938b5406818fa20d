"""Soak: mixed editor + agent traffic through `warmpath route` to two `warmpath serve` nodes for
--minutes, each node with its own KV tier on disk (--kv-offload-dir: one directory each, so each
node's bound is its own), with clients that give up at random (mid-prefill, mid-stream); node 1
killed (SIGKILL) and restarted twice, then restarted once more drained through the admin API first,
as an operator would; floods of requests past their deadline (`X-Deadline-Ms: 1`) and of clients
that hang up right after sending, from many session ids. Every --sample-every seconds it records
each process's RSS, open file descriptors and threads, each node's KV blocks in use, requests
running / waiting and tier bytes on disk, and the router's requests in flight; at the end, with the
traffic stopped and the nodes idle, the same once more. Then fixed greedy prompts (sent at the start
and again before each time node 1 goes down, so their prefixes were cached, evicted, lost to the
kills, kept in the tier) go through the router twice (the second time their prefixes cached), and to
a fresh `warmpath serve` without a tier: the answers must be the same, token for token. Writes JSON
and a PNG plot; prints the table and the verdict (soak_report.py; exit status 1 when it fails).
Loopback only.

    # the hour run (docs/benchmarks.md)
    python benchmarks/soak.py --minutes 60 --model qwen2.5-coder-0.5b
    # a quick look
    python benchmarks/soak.py --minutes 2 --model smollm2

Client-visible errors are answers a client did not ask to lose: a 5xx, an error event in a stream, a
connection error. Disconnects are the client's own doing and counted apart, as are the streams node
1 was sending when it was killed (the router ends them with its error event: nothing replays half an
answer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
# this checkout's warmpath, as the servers it starts run
sys.path[:0] = [str(ROOT), str(Path(__file__).parent)]
from common import machine, write_json  # noqa: E402
from soak_report import plot, summarize, table, verdict  # noqa: E402

from warmpath.models.footprint import parse_bytes  # noqa: E402
from warmpath.workloads import stdlib_files  # noqa: E402

ADMIN_KEY = "soak-admin"
CHECK_PROMPTS = 6


def start(args: list[str], log: Path) -> subprocess.Popen:
    """`warmpath ARGS` running this checkout's code (whatever the venv's `warmpath` script would
    import)."""
    env = {
        **os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT),
                                                                os.environ.get("PYTHONPATH")) if p)
    }
    return subprocess.Popen([sys.executable, "-m", "warmpath.cli", "--log-level", "warning", *args],
                            stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env)


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


def node_args(a, port: int) -> list[str]:
    """A node's flags: the fleet's nodes (with a tier each) and the fresh server their answers are
    compared with."""
    return [
        "--port",
        str(port), "--model", a.model, "--num-threads",
        str(a.threads), "--num-kv-blocks",
        str(a.node_blocks)
    ]


@dataclass
class Kill:
    node: int
    at: float  # time.monotonic() of the SIGKILL
    # the node's requests in flight at the router just before: the most the kill can cut
    in_flight: int
    # temporary tier files right after it (writes it cut short, and any in progress)
    cut_writes: int = 0


class Fleet:
    def __init__(self, a):
        self.a, self.logs = a, Path(a.logs)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.ports = [a.base_port + i for i in range(2)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.tiers = [self.logs / f"tier{i}" for i in range(2)]
        for tier in self.tiers:  # each soak starts cold
            shutil.rmtree(tier, ignore_errors=True)
        self.router_url = f"http://127.0.0.1:{a.base_port + 10}"
        self.restarts = 0
        self.kills: list[Kill] = []
        self.nodes = [self.start_node(i) for i in range(2)]
        self.router = start([
            "route", "--port",
            str(self.a.base_port + 10), "--health-interval", "0.5", "--admin-key", ADMIN_KEY,
            *(x for u in self.urls for x in ("--node", u))
        ], self.logs / "router.log")
        try:
            for url, proc in [
                    *zip(self.urls, self.nodes, strict=True), (self.router_url, self.router)
            ]:
                wait_ready(url, proc)
        except BaseException:
            self.close()
            raise

    def start_node(self, i: int) -> subprocess.Popen:
        return start([
            "serve", *node_args(self.a, self.ports[i]), "--kv-offload-dir",
            str(self.tiers[i]), "--kv-offload-bytes", self.a.kv_offload_bytes
        ], self.logs / f"node{i}.log")

    async def restart(self, i: int, http: httpx.AsyncClient) -> None:
        """Drain node i, wait for its streams to finish (bounded), stop it, start it again, take it
        back."""
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        await http.post(f"{self.router_url}/admin/nodes/drain", json={"node": self.urls[i]},
                        headers=admin)
        end = time.monotonic() + 60
        while time.monotonic() < end and (await self.in_flight(http)).get(self.urls[i], 0):
            await asyncio.sleep(0.2)
        await asyncio.to_thread(stop, self.nodes[i])
        self.nodes[i] = self.start_node(i)
        await asyncio.to_thread(wait_ready, self.urls[i], self.nodes[i])
        await http.post(f"{self.router_url}/admin/nodes/undrain", json={"node": self.urls[i]},
                        headers=admin)
        self.restarts += 1

    async def kill(self, i: int, http: httpx.AsyncClient) -> None:
        """SIGKILL node i under traffic, its tier writer mid-write or not; start it again on the
        same tier. The router finds it gone by itself (a refused connection) and back (its health
        check)."""
        in_flight = (await self.in_flight(http)).get(self.urls[i], 0)
        kill = Kill(i, time.monotonic(), in_flight)
        self.nodes[i].send_signal(signal.SIGKILL)
        await asyncio.to_thread(self.nodes[i].wait)
        kill.cut_writes = tier_usage(self.tiers[i])["tmp_files"]
        self.kills.append(kill)
        self.nodes[i] = self.start_node(i)
        await asyncio.to_thread(wait_ready, self.urls[i], self.nodes[i])

    def cut_by_kill(self, node_url: str | None, since: float) -> bool:
        """Whether a stream sent at `since` that ended in an error was node_url's, killed after
        that."""
        return any(self.urls[k.node] == node_url and k.at >= since for k in self.kills)

    async def in_flight(self, http: httpx.AsyncClient) -> dict[str, int]:
        nodes = (await http.get(f"{self.router_url}/health", timeout=5)).json()["nodes"]
        return {n["url"]: n["in_flight"] for n in nodes}

    def close(self) -> None:
        for p in [self.router, *self.nodes]:
            stop(p)


def tier_usage(root: Path) -> dict:
    """A tier directory on disk: its blocks' files (what the bound counts), the largest, and
    temporary files."""
    kv_bytes = kv_files = largest = tmp_files = 0
    for p in root.rglob("*"):
        try:
            if p.name.endswith(".kv"):
                size = p.stat().st_size
                kv_bytes, kv_files, largest = kv_bytes + size, kv_files + 1, max(largest, size)
            elif p.name.endswith(".tmp"):
                tmp_files += 1
        except OSError:
            pass  # deleted (evicted) while we looked
    return {
        "kv_bytes": kv_bytes, "kv_files": kv_files, "largest_file": largest, "tmp_files": tmp_files
    }


METRICS = {
    "kv_blocks_used": "warmpath_kv_cache_usage_ratio", "running": "warmpath_num_requests_running",
    "kv_cache_bytes": "warmpath_kv_cache_bytes", "waiting": "warmpath_num_requests_waiting",
    "tier_hit_tokens": "warmpath_prefix_cache_tier_hit_tokens_total",
    "tier_rejected": "warmpath_kv_tier_rejected_blocks_total",
    "heap_used": "warmpath_heap_used_bytes",
           "heap_trims": "warmpath_heap_trims_total", "heap_free": "warmpath_heap_free_bytes"
}


async def node_row(fleet: Fleet, i: int, http: httpx.AsyncClient) -> dict | None:
    try:
        text = (await http.get(f"{fleet.urls[i]}/metrics", timeout=5)).text
        g = {
            m.group(1): float(m.group(2))
            for m in re.finditer(r"^(warmpath_\w+) (\S+)$", text, re.M)
        }
        row = {k: g[name] for k, name in METRICS.items()}
    except (httpx.HTTPError, KeyError):
        return None  # restarting
    row["kv_blocks_used"] = round(row["kv_blocks_used"] * fleet.a.node_blocks)
    for k in ("heap_used", "heap_free"):  # malloc's view beside RSS: a leak grows the used part
        row[f"{k}_mb"] = round(row.pop(k) / 1e6, 1)
    return row


async def prefix_index_mb(fleet: Fleet, http: httpx.AsyncClient) -> float | None:
    """The router's prefix indexes, summed over the nodes: bounded by --prefix-index-blocks, filled
    by new prompts over the run (router/policies.py)."""
    try:
        text = (await http.get(f"{fleet.router_url}/metrics", timeout=5)).text
    except httpx.HTTPError:
        return None
    return round(
        sum(
            float(m)
            for m in re.findall(r"^warmpath_router_prefix_index_bytes\{.*\} (\S+)$", text, re.M)) /
        1e6, 1)


def kv_resident_mb(pid: int, kv_bytes: float) -> float | None:
    """The resident part of a node's KV pool: its one anonymous mapping of the pool's size
    (models/kv_cache.py allocates it from zero pages, mapped as blocks are first written), from
    /proc/PID/smaps. None: not found."""
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return None
    mappings: list[dict[str, int]] = []
    for line in text.splitlines():
        if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
            mappings.append({})
        elif mappings and line.endswith(" kB"):
            key, _, value = line.partition(":")
            mappings[-1][key] = int(value.split()[0]) * 1024
    for m in mappings:
        if kv_bytes <= m.get("Size", 0) <= kv_bytes + (4 << 20):
            return round(m.get("Rss", 0) / 1e6, 1)
    return None


async def sample(fleet: Fleet, http: httpx.AsyncClient, t0: float) -> dict:
    row = {"t": round(time.monotonic() - t0, 1), "procs": {}, "nodes": {}, "tiers": {}}
    for i in range(2):
        row["nodes"][f"node{i}"] = await node_row(fleet, i, http)
    for name, proc in [("router", fleet.router),
                       *((f"node{i}", p) for i, p in enumerate(fleet.nodes))]:
        try:
            p = psutil.Process(proc.pid)
            row["procs"][name] = {"pid": proc.pid, "rss_mb": round(p.memory_info().rss / 1e6, 1),
                                  "fds": p.num_fds(), "threads": p.num_threads()}
            node = row["nodes"].get(name)
            if node:
                # a node's KV pool pages, mapped as first used: its RSS grows to the pool's size by
                # design
                row["procs"][name]["kv_resident_mb"] = kv_resident_mb(proc.pid,
                                                                      node["kv_cache_bytes"])
        except psutil.Error:
            row["procs"][name] = None
    if row["procs"]["router"]:
        row["procs"]["router"]["prefix_index_mb"] = await prefix_index_mb(fleet, http)
    for i in range(2):
        row["tiers"][f"node{i}"] = await asyncio.to_thread(tier_usage, fleet.tiers[i])
    try:
        row["router_in_flight"] = sum((await fleet.in_flight(http)).values())
    except httpx.HTTPError:
        row["router_in_flight"] = None
    return row


class Traffic:
    """Editors (short prompts cut from real files, 16 tokens, a 3 s deadline) and agents (long chat
    contexts that grow, 64 tokens); a share of requests abandoned by their client at a random
    moment."""

    def __init__(self, fleet: Fleet, a, texts: list[str]):
        self.fleet, self.a, self.texts = fleet, a, texts
        self.counts = {
            "sent": 0, "ok": 0, "disconnected": 0, "silence": 0, "cut_by_kill": 0, "errors": 0
        }
        self.error_samples: list[str] = []

    def error(self, what: str) -> str:
        """Keep a few examples; the outcome to count."""
        if len(self.error_samples) < 20:
            self.error_samples.append(what[:300])
        return "errors"

    async def one(self, http: httpx.AsyncClient, path: str, body: dict, headers: dict,
                  give_up: float | None) -> str:
        """One streamed request through the router, given up after `give_up` seconds (None: never);
        its outcome, a key of `counts`."""
        sent = time.monotonic()
        try:
            async with asyncio.timeout(give_up):
                async with http.stream("POST", self.fleet.router_url + path, json=body,
                                       headers=headers) as r:
                    if r.status_code != 200:
                        body_text = (await r.aread()).decode(errors="replace")
                        return self.error(f"HTTP {r.status_code}: {body_text}")
                    finish = None
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            event = json.loads(line[6:])
                            if "error" in event:
                                if self.fleet.cut_by_kill(r.headers.get("x-warmpath-node"), sent):
                                    return "cut_by_kill"
                                return self.error(f"error event: {line}")
                            for c in event.get("choices") or []:
                                finish = c.get("finish_reason") or finish
            return "silence" if finish in ("deadline", "overloaded") else "ok"
        except TimeoutError:
            return "disconnected"
        except httpx.HTTPError as e:
            return self.error(repr(e))

    async def counted(self, http: httpx.AsyncClient, path: str, body: dict, headers: dict,
                      rng: random.Random) -> None:
        give_up = rng.uniform(0.05, 1.5) if rng.random() < self.a.disconnect_share else None
        self.counts["sent"] += 1
        self.counts[await self.one(http, path, body, headers, give_up)] += 1

    def editor_body(self, rng: random.Random, text: str, start: int, cursor: int) -> dict:
        return {"prompt": text[start:cursor], "suffix": text[cursor:cursor + 500], "max_tokens": 16,
                "temperature": 0 if rng.random() < 0.7 else 0.8, "stream": True}

    async def editor(self, k: int, end: float, http: httpx.AsyncClient) -> None:
        rng = random.Random(self.a.seed * 1000 + k)
        text, start, cursor = "", 0, 0
        while time.monotonic() < end:
            cursor += rng.randint(5, 80)  # typed on
            if cursor >= len(text) or cursor - start > 4000 or rng.random() < 0.05:
                # another file, or spot
                text = rng.choice(self.texts)
                cursor = rng.randint(500, max(501, len(text) - 1000))
                # the window the plugin sends: its prefix stays warm while typing
                start = max(0, cursor - 1500)
            body = self.editor_body(rng, text, start, cursor)
            await self.counted(http, "/v1/completions", body,
                               {"X-Session-Id": f"dev-{k}", "X-Deadline-Ms": "3000"}, rng)
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
                await self.counted(http, "/v1/chat/completions", body,
                                   {"X-Session-Id": f"agent-{k}"}, rng)
                context += "\n# tool output\n" + rng.choice(self.texts)[:rng.randint(200, 800)]
                await asyncio.sleep(rng.uniform(1.0, 4.0) * self.a.think)


class Flood:
    """Requests nobody waits for, --flood-rate a second for --flood-seconds, from --flood-sessions
    session ids (the same ids in every flood: what they fill of bounded tables the first flood
    fills, so a later one adds only what a flood leaves behind): every other one past its deadline
    before it starts (`X-Deadline-Ms: 1`: the answer is silence), the others from clients that hang
    up as soon as the request is sent."""

    def __init__(self, traffic: Traffic, a):
        self.traffic, self.a = traffic, a
        self.counts = {
            "sent": 0, "silence": 0, "ok": 0, "hung_up": 0, "disconnected": 0, "cut_by_kill": 0,
            "errors": 0
        }
        self.rng = random.Random(a.seed * 1000 + 900)

    async def run(self) -> None:
        end, n, tasks = time.monotonic() + self.a.flood_seconds, 0, set()
        async with httpx.AsyncClient(timeout=httpx.Timeout(60, connect=5),
                                     limits=httpx.Limits(max_connections=500)) as http:
            while time.monotonic() < end:
                tasks.add(asyncio.create_task(self.one(n, http)))
                tasks = {t for t in tasks if not t.done()}
                n += 1
                await asyncio.sleep(1 / self.a.flood_rate)
            await asyncio.gather(*tasks)

    async def one(self, n: int, http: httpx.AsyncClient) -> None:
        text = self.rng.choice(self.traffic.texts)
        cursor = self.rng.randint(500, max(501, len(text) - 1000))
        body = self.traffic.editor_body(self.rng, text, max(0, cursor - 1500), cursor)
        session = f"flood-{n % self.a.flood_sessions}"
        self.counts["sent"] += 1
        if n % 2:
            headers = {"X-Session-Id": session, "X-Deadline-Ms": "1"}
            self.counts[await self.traffic.one(http, "/v1/completions", body, headers, None)] += 1
        else:
            self.counts[await self.hang_up(body, session)] += 1

    async def hang_up(self, body: dict, session: str) -> str:
        """The request, whole, on a connection closed right after it: the client gone before any
        answer."""
        data = json.dumps(body).encode()
        head = (
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            "application/json\r\n"
            f"Content-Length: {len(data)}\r\nX-Session-Id: {session}\r\n\r\n").encode()
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", self.a.base_port + 10)
            writer.write(head + data)
            await writer.drain()
            writer.close()
            await writer.wait_closed()
        except OSError as e:  # the router refused the connection: an error the client sees
            return self.traffic.error(f"flood: {e!r}")
        return "hung_up"


def check_bodies(texts: list[str]) -> list[dict]:
    """Fixed greedy prompts, real files cut at a line's end: the answers compared with a fresh
    server's."""
    bodies = []
    for j in range(CHECK_PROMPTS):
        text = texts[(j * 17) % len(texts)]
        cut = text.index("\n", 1000 + 250 * j) + 1
        bodies.append({"prompt": text[:cut], "temperature": 0, "logprobs": 1})
    return bodies


async def answers(http: httpx.AsyncClient, url: str, bodies: list[dict], max_tokens: int,
                  seed: int = 0) -> list[dict]:
    """Each body's answer (text, tokens, prompt tokens cached and read from a tier), one session
    each, all at once. Another `seed` (no matter to a greedy answer) is another body: the router's
    response cache does not answer it."""
    async def one(j: int, body: dict) -> dict:
        r = await http.post(f"{url}/v1/completions",
                            json={**body, "max_tokens": max_tokens,
                                  "seed": seed}, headers={"X-Session-Id": f"check-{j}"})
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}: {r.text[:300]}"}
        choice, usage = r.json()["choices"][0], r.json()["usage"]
        details = usage.get("prompt_tokens_details") or {}
        return {"text": choice["text"], "tokens": (choice.get("logprobs") or {}).get("tokens"),
                "cached": details.get("cached_tokens"), "tier": details.get("tier_cached_tokens")}

    return list(await asyncio.gather(*(one(j, b) for j, b in enumerate(bodies))))


async def fresh_answers(a, bodies: list[dict]) -> list[dict]:
    """The check prompts' answers from a fresh `warmpath serve` (no tier), started once the fleet is
    gone."""
    proc = start(["serve", *node_args(a, a.base_port + 20)], Path(a.logs) / "fresh.log")
    url = f"http://127.0.0.1:{a.base_port + 20}"
    try:
        await asyncio.to_thread(wait_ready, url, proc)
        async with httpx.AsyncClient(timeout=120) as http:
            return await answers(http, url, bodies, a.check_tokens)
    finally:
        stop(proc)


@dataclass
class Event:
    at: float  # share of the run
    what: str  # "kill" | "restart" | "flood"


def schedule(a) -> list[Event]:
    events = [Event(x, "kill") for x in a.kill_at] + [Event(x, "flood") for x in a.flood_at]
    if a.restart_at >= 0:
        events.append(Event(a.restart_at, "restart"))
    return sorted(events, key=lambda e: e.at)


async def operate(fleet: Fleet, flood: Flood, a, t0: float, http: httpx.AsyncClient,
                  checks: list[dict]) -> list[dict]:
    """The operator's events in order, each when its time comes (or once the one before is done).
    Before node 1 goes down, the check prompts are sent again: those it holds are in its tier (or
    being written) when it dies."""
    done = []
    for n, e in enumerate(schedule(a), start=1):
        await asyncio.sleep(max(0.0, t0 + e.at * a.minutes * 60 - time.monotonic()))
        began = time.monotonic()
        done.append({"what": e.what, "t": round(began - t0, 1)})
        try:
            if e.what == "flood":
                await flood.run()
            else:
                await answers(http, fleet.router_url, checks, 4, seed=n)
                await (fleet.kill(1, http) if e.what == "kill" else fleet.restart(1, http))
        except RuntimeError as error:
            # node 1 did not come back: the verdict fails, the run's samples are kept
            done[-1]["failed"] = str(error)
            return done
        done[-1]["took_s"] = round(time.monotonic() - began, 1)
    return done


async def settle(fleet: Fleet, http: httpx.AsyncClient, t0: float, limit_s: float,
                 samples: list[dict]) -> float | None:
    """With the traffic stopped: until nothing is in flight, running, waiting or held for 3 samples
    in a row (the warm-ups of prompts left unfinished compute on until then), bounded; how long that
    took (None: never)."""
    began, idle = time.monotonic(), 0
    while time.monotonic() < began + limit_s:
        samples.append(last := await sample(fleet, http, t0))
        nodes = [n for n in last["nodes"].values() if n]
        quiet = last["router_in_flight"] == 0 and len(nodes) == 2 and \
            all(n["kv_blocks_used"] == n["running"] == n["waiting"] == 0 for n in nodes)
        idle = idle + 1 if quiet else 0
        if idle == 3:
            return round(time.monotonic() - began, 1)
        await asyncio.sleep(1)
    return None


async def soak(a) -> dict:
    texts = [p.read_text(errors="replace") for p in stdlib_files()[:200]]
    checks = check_bodies(texts)
    fleet = Fleet(a)
    samples, events = [], []
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=5),
                                     limits=httpx.Limits(max_connections=200)) as http:
            # their prefixes cached (and kept in the tiers)
            await answers(http, fleet.router_url, checks, 4)
            t0 = time.monotonic()
            end = t0 + a.minutes * 60
            traffic = Traffic(fleet, a, texts)
            flood = Flood(traffic, a)
            clients = [asyncio.create_task(traffic.editor(k, end, http)) for k in range(a.editors)]
            clients += [asyncio.create_task(traffic.agent(k, end, http)) for k in range(a.agents)]
            operator = asyncio.create_task(operate(fleet, flood, a, t0, http, checks))
            while time.monotonic() < end:
                samples.append(await sample(fleet, http, t0))
                await asyncio.sleep(a.sample_every)
            await asyncio.gather(*clients)
            events = await operator
            drained = await settle(fleet, http, t0, a.settle_seconds, samples)
            after = await answers(http, fleet.router_url, checks, a.check_tokens)
            # their prefixes cached now
            again = await answers(http, fleet.router_url, checks, a.check_tokens, seed=1)
            # its last sample is the end: KV blocks held must be 0
            await settle(fleet, http, t0, 60, samples)
    finally:
        fleet.close()
    fresh = await fresh_answers(a, checks)
    return {
        "samples": samples, "counts": traffic.counts, "flood": flood.counts, "events": events,
        "error_samples": traffic.error_samples, "restarts": fleet.restarts, "kills": [{
            "node": k.node, "t": round(k.at - t0, 1), "in_flight": k.in_flight,
            "cut_writes": k.cut_writes
        } for k in fleet.kills],
        "answers": {"router": after, "router_again": again, "fresh": fresh}, "drained_s": drained
    }


def shares(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--editors", type=int, default=4)
    p.add_argument("--agents", type=int, default=1)
    p.add_argument("--think", type=float, default=1.0,
                   help="scales every client's pause between requests")
    p.add_argument("--disconnect-share", type=float, default=0.2,
                   help="requests the client abandons")
    p.add_argument(
        "--kill-at", type=shares, default=[0.25, 0.45], help="shares of the run at which node 1 is "
        "killed (SIGKILL) and started again, comma-separated")
    p.add_argument(
        "--restart-at", type=float, default=0.55,
        help="share of the run at which node 1 is drained "
        "and restarted; negative: never")
    p.add_argument("--flood-at", type=shares, default=[0.15, 0.75],
                   help="shares of the run at which a flood "
                   "starts, comma-separated")
    p.add_argument("--flood-seconds", type=float, default=120.0)
    p.add_argument("--flood-rate", type=float, default=20.0,
                   help="requests a second during a flood")
    p.add_argument("--flood-sessions", type=int, default=1000,
                   help="session ids a flood's requests come from")
    p.add_argument("--sample-every", type=float, default=5.0)
    p.add_argument(
        "--settle-seconds", type=float, default=900.0, help="the most to wait, with the traffic "
        "stopped, for the nodes to finish what they hold (the floods' warm-ups)")
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--threads", type=int, default=1, help="per node")
    p.add_argument("--node-blocks", type=int, default=1024)
    p.add_argument("--kv-offload-bytes", default="256MiB",
                   help="each node's tier bound (the LRU must run)")
    p.add_argument("--check-tokens", type=int, default=32, help="tokens of each answer compared")
    p.add_argument("--base-port", type=int, default=18300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--logs", default="/tmp/warmpath-soak")
    p.add_argument("--out", default="benchmarks/results/soak.json")
    p.add_argument("--plot", default="benchmarks/results/soak.png")
    a = p.parse_args()
    result = asyncio.run(soak(a))
    result.update(minutes=a.minutes, editors=a.editors, agents=a.agents, model=a.model,
                  machine=machine(), disconnect_share=a.disconnect_share,
                  kv_offload_bytes=parse_bytes(a.kv_offload_bytes), kills_asked=len(a.kill_at))
    result["summary"] = summarize(result)
    result["verdict"] = verdict(result)
    write_json(a.out, result)
    plot(result, a.plot)
    print(table(result))
    if result["error_samples"]:
        print("errors, first few:\n  " + "\n  ".join(result["error_samples"]))
    sys.exit(0 if all(v["ok"] is not False for v in result["verdict"].values()) else 1)


if __name__ == "__main__":
    main()
