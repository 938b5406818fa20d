"""Record what real vLLM and llama.cpp servers print, as test fixtures for warmpath's engine parsers
(issue 22).

    python benchmarks/capture_engine_texts.py --vllm http://127.0.0.1:8002 --llamacpp http://127.0.0.1:8003
    # also the probes
    python benchmarks/capture_engine_texts.py --llamacpp http://127.0.0.1:8003 --probe

It starts nothing: point it at servers already running (benchmarks/baselines/vllm_cpu.py serve,
benchmarks/baselines/llama_server.py serve), best one at a time on a small machine. Into
tests/data/engines/ (--out) it writes, byte for byte as the server sent them:

    {engine}_metrics_idle.txt   /metrics with nothing in flight
    {engine}_metrics_busy.txt   /metrics while 6 long streaming requests are in flight, the snapshot
                                with the most requests waiting (llama.cpp also
                                {engine}_slots_busy.json, /slots at that moment)
    {engine}_metrics_after.txt  /metrics once idle again after 6 requests sharing a long prefix
                                (cache hits)
    {engine}_models.json        GET /v1/models
    vllm_health.txt             status line + body of GET /health;
                                llamacpp_health.json / llamacpp_props.json

--probe then asks each server the questions a router needs answered and prints them as JSON
(--report to save): is `suffix` accepted on /v1/completions, is X-Deadline-Ms read, what a response
says about cached prompt tokens, and whether the engine stops a request when its client goes away
(mid-stream; a non-streaming request closed after 0.5 s while /metrics is polled at 20 Hz, while
nothing is asked for 3 s, and while another stream runs), judged from the engine's own metrics (and
/slots). --aborts-only runs just those. Never part of `make test`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import socket
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "engines"
# The gauges that say how many requests an engine is running and how many wait (picks the busy
# snapshot).
GAUGES = {"vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
          "llamacpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred")}
# A long shared prefix: real code, repeated to roughly 1500 tokens.
PREFIX = ("import os\nimport sys\n\n\ndef walk(root: str) -> list[str]:\n    out = []\n"
          "    for dirpath, _dirs, files in os.walk(root):\n        for name in files:\n"
          "            out.append(os.path.join(dirpath, name))\n    return out\n\n\n") * 20


class Engine:
    def __init__(self, kind: str, url: str, model: str):
        self.kind, self.model = kind, model
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80

    def conn(self, timeout: float = 600) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(self, path: str) -> tuple[int, bytes]:
        c = self.conn(30)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def post(self, path: str, body: dict, headers: dict | None = None) -> tuple[int, bytes]:
        c = self.conn()
        try:
            c.request("POST", path, json.dumps(body),
                      {"Content-Type": "application/json", **(headers or {})})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def completion(self, prompt: str, max_tokens: int, **extra) -> dict:
        body = {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            **extra
        }
        status, raw = self.post("/v1/completions", body)
        if status != 200:
            raise RuntimeError(f"{self.kind}: /v1/completions answered {status}: {raw[:300]!r}")
        return json.loads(raw)

    def metrics(self) -> bytes:
        status, raw = self.get("/metrics")
        if status != 200:
            raise RuntimeError(f"{self.kind}: /metrics answered {status}: {raw[:300]!r}")
        return raw

    def gauges(self, text: bytes | None = None) -> tuple[float, float]:
        """(running, waiting) as the engine reports them (summed over label sets)."""
        text = (text or self.metrics()).decode()
        return tuple(metric_sum(text, name) for name in GAUGES[self.kind])  # type: ignore[return-value]

    def wait_idle(self, timeout: float = 300) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.gauges() == (0, 0):
                return
            time.sleep(0.2)
        raise RuntimeError(f"{self.kind}: still busy after {timeout} s")


def metric_sum(text: str, name: str, labels: str = "") -> float:
    """Sum of every sample of `name` whose label set contains the `labels` substring."""
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        if labels in (m.group(1) or ""):
            total += float(m.group(2))
    return total


class Stream:
    """A streaming completion on its own socket, read in a thread, that can be dropped at any
    moment."""

    def __init__(self, engine: Engine, prompt: str, max_tokens: int, stop_after: int | None = None,
                 **extra):
        self.events = 0
        self.error: str | None = None
        self.engine, self.stop_after = engine, stop_after
        self.body = {
            "model": engine.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, **extra
        }
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        c = self.engine.conn()
        try:
            c.request("POST", "/v1/completions", json.dumps(self.body),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                self.error = f"{r.status}: {r.read()[:300]!r}"
                return
            while line := r.readline():
                if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                    self.events += 1
                    if self.stop_after is not None and self.events >= self.stop_after:
                        c.sock.shutdown(socket.SHUT_RDWR)  # the client goes away mid-stream
                        return
        except OSError as e:
            self.error = repr(e)
        finally:
            c.close()
            self.done.set()


def write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    print(f"  wrote {path} ({len(data)} bytes)")


def capture(e: Engine, out: Path) -> None:
    print(f"{e.kind}: capturing into {out}")
    e.wait_idle()
    write(out / f"{e.kind}_metrics_idle.txt", e.metrics())
    write(out / f"{e.kind}_models.json", e.get("/v1/models")[1])
    if e.kind == "vllm":
        status, body = e.get("/health")
        write(out / "vllm_health.txt", f"{status}\n".encode() + body)
    else:
        write(out / "llamacpp_health.json", e.get("/health")[1])
        write(out / "llamacpp_props.json", e.get("/props")[1])

    # Busy: 6 long streams at once (distinct long prompts, so prefill keeps some of them waiting);
    # keep the snapshot with the most requests waiting, ties broken by the most running.
    streams = [Stream(e, f"# file {i}\n" + PREFIX[i * 7:], 400, ignore_eos=True) for i in range(6)]
    best, best_key, slots = b"", (-1.0, -1.0), b""
    while not all(s.done.is_set() for s in streams):
        text = e.metrics()
        running, waiting = e.gauges(text)
        if (waiting, running) > best_key:
            best, best_key = text, (waiting, running)
            if e.kind == "llamacpp":
                slots = e.get("/slots")[1]
        time.sleep(0.1)
    errors = [s.error for s in streams if s.error]
    if errors:
        raise RuntimeError(f"{e.kind}: busy streams failed: {errors}")
    print(f"  busy snapshot: running={best_key[1]:g} waiting={best_key[0]:g}")
    write(out / f"{e.kind}_metrics_busy.txt", best)
    if e.kind == "llamacpp":
        write(out / "llamacpp_slots_busy.json", slots)

    # After: one after another, 6 requests that share a long prefix, so the prefix-cache counters
    # move.
    e.wait_idle()
    for i in range(6):
        e.completion(PREFIX + f"\ndef helper_{i}(", 8)
    e.wait_idle()
    write(out / f"{e.kind}_metrics_after.txt", e.metrics())


def watch_until_idle(e: Engine, t0: float, limit: float, companion: Stream | None) -> dict:
    """Seconds from t0 until the engine runs nothing but the companion stream (polling /metrics at
    20 Hz)."""
    seen_busy = False
    while time.monotonic() - t0 < limit:
        running, waiting = e.gauges()
        busy = running + waiting - (1 if companion and not companion.done.is_set() else 0)
        seen_busy |= busy > 0
        if busy <= 0:
            return {"idle_after_s": round(time.monotonic() - t0, 2), "seen_busy": seen_busy}
        time.sleep(0.05)
    return {"idle_after_s": None, "seen_busy": seen_busy, "still_busy_at_s": limit}


def abort_probe(e: Engine, streaming: bool, quiet: float = 0.0,
                with_companion: bool = False) -> dict:
    """Start a 2000-token request, drop the client (after 3 events, or after 0.5 s), watch the
    engine's metrics.

    quiet: ask the server nothing for that many seconds after the close, then look (llama.cpp checks
    a non-streaming client only after 1 s with no result for any task). with_companion: another
    stream keeps generating meanwhile."""
    e.wait_idle()
    companion = None
    if with_companion:
        companion = Stream(e, "class Tree:\n", 400, ignore_eos=True)
        while companion.events == 0 and not companion.done.is_set():
            time.sleep(0.05)
    before = e.metrics().decode()
    t0 = time.monotonic()
    if streaming:
        s = Stream(e, "def main():\n", 2000, stop_after=3, ignore_eos=True)
        s.done.wait(120)
        dropped = round(time.monotonic() - t0, 2)
    else:
        c = e.conn()
        body = {
            "model": e.model, "prompt": "def main():\n", "max_tokens": 2000, "temperature": 0,
            "ignore_eos": True
        }
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        time.sleep(0.5)
        c.sock.shutdown(socket.SHUT_RDWR)  # the client goes away
        c.close()
        dropped = 0.5
    time.sleep(quiet or 0.3)
    slots = None
    if e.kind == "llamacpp":
        slots = [{k: s.get(k)
                  for k in ("id", "is_processing", "id_task")}
                 for s in json.loads(e.get("/slots")[1])]
    result = {"client_closed_at_s": dropped, "first_look_at_s": round(time.monotonic() - t0, 2),
              "slots_at_first_look": slots, "companion_stream": with_companion,
              **watch_until_idle(e, t0, 180, companion)}
    if companion:
        companion.done.wait(300)
    e.wait_idle()
    after = e.metrics().decode()
    if e.kind == "vllm":
        for reason in ("abort", "length", "stop"):
            name, lab = "vllm:request_success_total", f'finished_reason="{reason}"'
            delta = metric_sum(after, name, lab) - metric_sum(before, name, lab)
            result[f"request_success_total[{reason}]_delta"] = delta
        result["generation_tokens_delta"] = (metric_sum(after, "vllm:generation_tokens_total")
                                             - metric_sum(before, "vllm:generation_tokens_total"))
    else:
        result["tokens_predicted_delta"] = (metric_sum(after, "llamacpp:tokens_predicted_total")
                                            - metric_sum(before, "llamacpp:tokens_predicted_total"))
    if companion:
        result["note"] = "deltas include the companion stream's 400 tokens"
    return result


def probe(e: Engine, aborts_only: bool = False) -> dict:
    print(f"{e.kind}: probing")
    report: dict = {}
    e.wait_idle()
    if aborts_only:
        return abort_probes(e, report)
    # Generation speed, to compare the abort timings with how long 2000 tokens would take.
    t0 = time.monotonic()
    r = e.completion("def main():\n", 200, ignore_eos=True)
    report["decode_tok_per_s"] = round(r["usage"]["completion_tokens"] / (time.monotonic() - t0), 1)

    status, raw = e.post(
        "/v1/completions", {
            "model": e.model, "prompt": "def add(a, b):\n    ", "suffix": "\n    return c\n",
            "max_tokens": 8, "temperature": 0
        })
    report["suffix"] = {"status": status, "body": raw.decode(errors="replace")[:2000]}

    t0 = time.monotonic()
    status, raw = e.post(
        "/v1/completions", {
            "model": e.model, "prompt": "def main():\n", "max_tokens": 100, "temperature": 0,
            "ignore_eos": True
        }, {"X-Deadline-Ms": "1"})
    body = json.loads(raw) if status == 200 else raw.decode()
    report["x_deadline_ms_1"] = {
        "status": status, "elapsed_s": round(time.monotonic() - t0, 2),
        "completion_tokens": body["usage"]["completion_tokens"] if status == 200 else None,
        "finish_reason": body["choices"][0]["finish_reason"] if status == 200 else body
    }

    # Cached prompt tokens in the response: the same long prompt twice; the second should hit the
    # prefix cache.
    prompt = PREFIX + "\ndef cached_probe("
    cold = e.completion(prompt, 4)
    warm = e.completion(prompt, 4)
    keys = ("usage", "timings", "tokens_cached", "system_fingerprint")
    report["cached_tokens_in_response"] = {"first": {k: cold.get(k) for k in keys if k in cold},
                                           "second": {k: warm.get(k) for k in keys if k in warm},
                                           "top_level_keys": sorted(warm)}
    if e.kind == "llamacpp":
        # The native /completion route: tokens_cached, timings.cache_n, and what cache_prompt=false
        # changes.
        native = {}
        for cache_prompt in (True, False):
            status, raw = e.post("/completion", {"prompt": prompt, "n_predict": 4, "temperature": 0,
                                                 "cache_prompt": cache_prompt})
            j = json.loads(raw)
            native[f"cache_prompt={cache_prompt}"] = {
                "status": status, "tokens_cached": j.get("tokens_cached"),
                "tokens_evaluated": j.get("tokens_evaluated"), "timings": j.get("timings")
            }
        oai = e.completion(prompt, 4, cache_prompt=False)
        native["v1_completions_cache_prompt=false"] = {k: oai.get(k) for k in ("usage", "timings")}
        report["llamacpp_native_completion"] = native

    return abort_probes(e, report)


def abort_probes(e: Engine, report: dict) -> dict:
    report["abort_mid_stream"] = abort_probe(e, streaming=True)
    report["abort_non_streaming_0.5s_metrics_polled_20hz"] = abort_probe(e, streaming=False)
    report["abort_non_streaming_0.5s_nothing_asked_for_3s"] = abort_probe(
        e, streaming=False, quiet=3)
    report["abort_non_streaming_0.5s_another_stream_running"] = abort_probe(
        e, streaming=False, quiet=3, with_companion=True)
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vllm", help="base URL of a running vLLM server")
    p.add_argument("--llamacpp", help="base URL of a running llama-server")
    p.add_argument("--model", default="smollm2",
                   help="the served model name (both scripts serve it as smollm2)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--probe", action="store_true",
                   help="also run the probes and print their answers as JSON")
    p.add_argument("--no-capture", action="store_true", help="only the probes")
    p.add_argument("--aborts-only", action="store_true",
                   help="of the probes, only the client-abort ones")
    p.add_argument("--report", type=Path, help="write the probes' JSON here too")
    args = p.parse_args()
    engines = [
        Engine(kind, url, args.model)
        for kind, url in (("vllm", args.vllm), ("llamacpp", args.llamacpp)) if url
    ]
    if not engines:
        sys.exit("give --vllm URL and/or --llamacpp URL")
    args.out.mkdir(parents=True, exist_ok=True)
    reports = {}
    for e in engines:
        if not args.no_capture:
            capture(e, args.out)
        if args.probe or args.no_capture:
            reports[e.kind] = probe(e, args.aborts_only)
    if reports:
        text = json.dumps(reports, indent=2)
        print(text)
        if args.report:
            args.report.write_text(text)


if __name__ == "__main__":
    main()
