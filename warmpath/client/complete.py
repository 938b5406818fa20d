"""`warmpath complete FILE:LINE:COL --target URL`: one suggestion, asked for the way the editor
plugin asks (prefix before the cursor, suffix after it, streamed, the client deadline applied),
printed to stdout; timing and cache figures go to stderr."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx

from warmpath.client.completion import (
    DROPPED,
    ERROR,
    RequestRecord,
    Target,
    discover_model,
    monotonic_clock,
    stream_completion,
)
from warmpath.config import ClientConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("location", help="FILE:LINE:COL, 1-based (COL counts characters)")
    p.add_argument("--target", default="http://127.0.0.1:8000",
                   help="warmpath serve or warmpath route")
    p.add_argument("--api-key", help="sent as Authorization: Bearer")
    p.add_argument("--max-tokens", type=int, default=ClientConfig.max_tokens,
                   help="the longest suggestion")
    p.add_argument("--deadline-ms", type=float, default=None,
                   help="drop the suggestion if the first token is later (default: wait)")
    p.add_argument("--prefix-chars", type=int, default=5000,
                   help="characters of the file before the cursor sent")
    p.add_argument("--suffix-chars", type=int, default=1000,
                   help="characters of the file after the cursor sent")
    p.add_argument("--fim", action=argparse.BooleanOptionalAction, default=True,
                   help="send the suffix")


def split_at(text: str, line: int, col: int) -> int:
    """Character offset of 1-based LINE:COL; COL past the end of the line means its end."""
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        raise ValueError(f"line {line} is outside the file (1-{len(lines)})")
    if col < 1:
        raise ValueError("COL is 1-based")
    return sum(len(x) + 1 for x in lines[: line - 1]) + min(col - 1, len(lines[line - 1]))


def parse_location(location: str) -> tuple[Path, int, int]:
    path, _, rest = location.rpartition(":")
    path, _, line = path.rpartition(":")
    if not path or not line.isdigit() or not rest.isdigit():
        raise ValueError(f"expected FILE:LINE:COL, got {location!r}")
    return Path(path), int(line), int(rest)


async def complete_at(args: argparse.Namespace) -> int:
    try:
        path, line, col = parse_location(args.location)
        text = path.read_text(encoding="utf-8")
        cursor = split_at(text, line, col)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    prefix, suffix = text[max(0, cursor - args.prefix_chars):cursor], text[cursor:cursor +
                                                                           args.suffix_chars]
    target = Target(args.target, api_key=args.api_key)
    clock = monotonic_clock()
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0)) as http:
        target.model = await discover_model(http, target)
        body = {"prompt": prefix, "max_tokens": args.max_tokens, "temperature": 0.0}
        if args.fim and suffix:
            body["suffix"] = suffix
        rec = RequestRecord("cli", "editor", clock(), prompt_chars=len(prefix))
        deadline = None if args.deadline_ms is None else args.deadline_ms / 1000
        await stream_completion(http, target, body, rec, clock, first_token_deadline_s=deadline)
    if rec.outcome == ERROR:
        print(f"error: {rec.error}", file=sys.stderr)
        return 1
    if rec.outcome != DROPPED:
        print(rec.text)
    ttft = "-" if rec.ttft is None else f"{rec.ttft * 1000:.0f} ms"
    cached = ("" if rec.cached_tokens is None else
              f", {rec.cached_tokens}/{rec.prompt_tokens} prompt tokens cached")
    print(f"[{rec.outcome}: TTFT {ttft}, {rec.tokens} tokens{cached}]", file=sys.stderr)
    return 0
