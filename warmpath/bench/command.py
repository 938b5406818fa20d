"""The `warmpath bench` command: one trace of real-code traffic replayed against a target and, one
after the other on the same machine, each baseline; a table with the ratios, JSON, and a PNG."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

from warmpath.bench.report import summarize, table
from warmpath.bench.runner import RunResult, replay
from warmpath.client.completion import ERROR, PROTOCOLS, Target
from warmpath.client.outcome import censored_ttfts
from warmpath.config import SLO, BenchConfig, ClientConfig
from warmpath.cpu import cpu_label
from warmpath.workloads import WORKLOADS, Trace, make_trace

B = BenchConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="http://127.0.0.1:8000",
                   help="server under test (default: %(default)s)")
    p.add_argument("--baseline", action="append", default=[],
                   help="server(s) to compare against, same trace")
    p.add_argument("--names",
                   help="comma-separated labels for target and baselines (default: from the URLs)")
    p.add_argument(
        "--protocols",
        help="comma-separated, per target and baseline: openai (/v1/completions, the "
        "default), infill (llama.cpp's /infill, as llama.vim sends it), mistral "
        "(/v1/fim/completions), "
        "ollama (/api/generate) or tabby (Tabby's completions, not streamed)")
    p.add_argument("--api-key", help="Bearer key for every server")
    p.add_argument("--workload", choices=WORKLOADS, default=B.workload,
                   help="editor: developers typing; agent: coding-agent turns; mixed: both")
    p.add_argument("--developers", type=int, default=B.developers,
                   help="sessions: developers (and agents, for mixed)")
    p.add_argument("--duration", type=float, default=B.duration,
                   help="seconds of (compressed) trace time")
    p.add_argument(
        "--rate", type=float, default=B.rate,
        help="idle-time compression: 1 = real time (~10 requests in 4 min, then 30 min away); "
        "30 = the idle gaps 30x shorter (typing speed and debounce stay human)")
    p.add_argument("--agent-share", type=float, default=B.agent_share,
                   help="mixed: share of sessions that are agents")
    p.add_argument("--seed", type=int, default=B.seed,
                   help="the trace is the same for the same seed")
    p.add_argument("--trace", help="replay this JSONL trace instead of generating one")
    p.add_argument("--save-trace", help="write the trace (JSONL) here")
    p.add_argument("--debounce-ms", type=float, default=ClientConfig.debounce_ms,
                   help="keystrokes closer than this send no request")
    p.add_argument("--deadline-ms", type=float, default=ClientConfig.deadline_ms,
                   help="client deadline for the first token of an editor suggestion")
    p.add_argument("--max-tokens", type=int, default=ClientConfig.max_tokens,
                   help="editor suggestion length")
    p.add_argument("--fim", action=argparse.BooleanOptionalAction, default=ClientConfig.fim,
                   help="send the suffix")
    p.add_argument("--slo-ms", type=float, default=SLO.editor_ttft_s * 1000,
                   help="editor TTFT SLO for goodput")
    p.add_argument("--agent-slo-ms", type=float, default=SLO.agent_ttft_s * 1000,
                   help="agent TTFT SLO for goodput")
    p.add_argument("--cooldown", type=float, default=B.cooldown,
                   help="seconds between the runs of two servers")
    p.add_argument("--json", dest="json_path",
                   help="write the full report (and per-request records) here")
    p.add_argument("--plot", help="write the PNG here")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="a progress line while the trace replays")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")


def _count_tokens():
    """The bundled tokenizer, to size agent contexts exactly; None (a chars/token estimate) if it is
    not here."""
    from warmpath.models.registry import load_tokenizer

    try:
        tok = load_tokenizer()
    except (OSError, ValueError):
        return None
    return lambda s: len(tok.encode(s))


def _label(url: str) -> str:
    return url.split("//")[-1].rstrip("/").removesuffix("/v1")


def _record(r) -> dict:
    return {
        "session": r.session, "kind": r.kind, "sent": round(r.sent, 4),
        "ttft": None if r.ttft is None else round(r.ttft, 4),
        "done": None if r.done is None else round(r.done, 4), "outcome": r.outcome,
        "tokens": r.tokens, "prompt_chars": r.prompt_chars, "prompt_tokens": r.prompt_tokens,
        "cached_tokens": r.cached_tokens, "finish_reason": r.finish_reason, "error": r.error,
        "node": r.node
    }


def run(args: argparse.Namespace) -> int:
    if args.trace:
        trace = Trace.load(args.trace)
    else:
        count = _count_tokens() if args.workload in ("agent", "mixed") else None
        trace = make_trace(args.workload, args.developers, args.duration, args.seed, args.rate,
                           args.agent_share, count_tokens=count)
    if args.save_trace:
        trace.save(args.save_trace)
    urls = [args.target] + args.baseline
    names = args.names.split(",") if args.names else [_label(u) for u in urls]
    if len(names) != len(urls):
        print("error: --names needs one label per target and baseline", file=sys.stderr)
        return 2
    cfg = ClientConfig(debounce_ms=args.debounce_ms, deadline_ms=args.deadline_ms,
                       max_tokens=args.max_tokens, fim=args.fim)
    slo = SLO(editor_ttft_s=args.slo_ms / 1000, agent_ttft_s=args.agent_slo_ms / 1000)
    meta = trace.meta
    keys = sum(e["type"] == "key" for e in trace.events)
    turns = sum(e["type"] == "turn" for e in trace.events)
    print(
        f"trace: {meta.get('workload')} workload, {len(trace.sessions)} sessions, "
        f"{meta.get('duration_s')} s, "
        f"seed {meta.get('seed')}, idle time compressed x{meta.get('rate')}: {keys} keystrokes, "
        f"{turns} agent turns",
        file=sys.stderr)
    runs: list[RunResult] = []
    protocols = args.protocols.split(",") if args.protocols else ["openai"] * len(urls)
    if len(protocols) != len(urls) or not set(protocols) <= set(PROTOCOLS):
        print(f"error: --protocols needs one of {', '.join(PROTOCOLS)} per server", file=sys.stderr)
        return 2
    for i, (url, name, protocol) in enumerate(zip(urls, names, protocols, strict=True)):
        if i:
            time.sleep(args.cooldown)
        result = asyncio.run(
            replay(trace, Target(url, api_key=args.api_key, protocol=protocol), cfg, label=name,
                   progress=args.progress))
        if result.metrics_before and result.metrics_before.get("prefix_queried_tokens"):
            print(
                f"note: {name} has served before this run; its cache may hold prefixes from "
                "earlier runs",
                file=sys.stderr)
        runs.append(result)
    summaries = [summarize(r, slo) for r in runs]
    print()
    print(
        f"warmpath bench: {meta.get('workload')}, {len(trace.sessions)} sessions, "
        f"{meta.get('duration_s')} s "
        f"(idle compressed x{meta.get('rate')}), seed {meta.get('seed')}; client: debounce "
        f"{cfg.debounce_ms:.0f} ms, deadline {cfg.deadline_ms:.0f} ms, max_tokens "
        f"{cfg.max_tokens}; "
        f"SLO editor TTFT <= {args.slo_ms:.0f} ms, agent <= {args.agent_slo_ms:.0f} ms")
    print(table(summaries, names, cfg.deadline_ms, markdown=args.markdown))
    for name, s in zip(names, summaries, strict=True):
        if s["outcomes"].get(ERROR):
            print(f"{name}: {s['outcomes'][ERROR]} request(s) failed, e.g. {s['errors'][:2]}")
        print(f"{name}: prefix hit rate from {s.get('prefix_hit_rate_source')}")
    report = {
        "command": " ".join(["warmpath", "bench"] + sys.argv[2:]), "machine": cpu_label(),
        "trace": meta, "client": asdict(cfg), "slo": asdict(slo), "names": names,
        "summaries": summaries, "records": {
            name: [_record(r) for r in res.records]
            for name, res in zip(names, runs, strict=True)
        }
    }
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(_finite(report), indent=1))
        print(f"wrote {args.json_path}")
    if args.plot:
        from warmpath.bench.plot import plot

        ttfts = [censored_ttfts(r for r in res.records if r.kind == "editor") for res in runs]
        title = (
            f"warmpath bench --workload {meta.get('workload')}: {len(trace.sessions)} sessions, "
            f"{meta.get('duration_s')} s, idle x{meta.get('rate')}")
        plot(summaries, ttfts, names, args.plot, title, slo.editor_ttft_s)
        print(f"wrote {args.plot}")
    return 1 if any(s["outcomes"].get(ERROR) for s in summaries) else 0


def _finite(v):
    """Strict JSON: a censored (+inf) or missing (nan) figure becomes null."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    return v
