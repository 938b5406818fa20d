"""`warmpath eval --target URL`: the code quality of a served model's fill-in-the-middle
completions, measured by running them. HumanEval single-line infilling (eval/humaneval.py): each
task's prefix and suffix go to the server as an editor sends them (`/v1/completions` with `suffix`,
or llama.cpp's `/infill`), greedy; the program with the answer in the hole is run against the
problem's tests (eval/execute.py). pass@1 = the share that pass. Any server speaking either protocol
can be scored, llama.cpp's `llama-server` too; `--protocol fim-prompt` sends every server the same
prompt (the family's FIM form written out), so only the model's numbers differ.

`--insert first-line` (the benchmark as published) sends `stop: ["\\n"]` and keeps the answer's
first line, as a client that cuts there does; `--insert whole` sends no stop and splices in the
whole answer, as Zed does: where the answer ends is then the server's (its completion scope,
api/scope.py; `--scope` asks for one per request). `--hole lines` hides 2-5 consecutive lines
instead of one. Each task records the tokens the server generated."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import get_args

import httpx

from warmpath.api.fim import LAYOUTS, Fill, detect_fim, render
from warmpath.client.completion import (
    PROTOCOLS,
    RequestRecord,
    Target,
    discover_model,
    monotonic_clock,
    stream_completion,
)
from warmpath.config import CompletionScope
from warmpath.eval import repo
from warmpath.eval.execute import passes
from warmpath.eval.humaneval import (
    fetch_problems,
    mid_line,
    multi_line_tasks,
    single_line_tasks,
    spread,
)
from warmpath.eval.sandbox import probe

FIM_PROMPT = "fim-prompt"
CURSORS = ("line-start", "mid-line")
INSERTS = ("first-line", "whole")
HOLES = ("line", "lines")
SUITES = ("humaneval", "repo")


@dataclass
class TaskResult:
    task_id: str
    completion: str
    passed: bool
    seconds: float
    tokens: int = 0  # completion tokens the server generated for it
    error: str | None = None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--suite", choices=SUITES, default="humaneval", help=
        "humaneval: HumanEval infilling, pass@1 of the programs; repo: real repositories' files, "
        "judged as the editor inserts the answer (eval/repo.py)")
    p.add_argument("--target", default="http://127.0.0.1:8000", help="the server to score")
    p.add_argument(
        "--protocol", choices=(*PROTOCOLS, FIM_PROMPT), default="openai",
        help="openai: /v1/completions with suffix; infill: llama.cpp's /infill (its own prompt: "
             "the "
        "repo-level form); fim-prompt: the family's FIM prompt written out, on /v1/completions "
        "(the same prompt for every server)")
    p.add_argument(
        "--fim-family",
        help="fim-prompt: the family whose template to write (default: from the model's "
        "name, e.g. qwen2.5-coder)")
    p.add_argument(
        "--fim-layout", choices=LAYOUTS, default="anchored",
        help="fim-prompt: the layout written (a server's own protocols: its --fim-layout)")
    p.add_argument(
        "--cursor", choices=CURSORS, default="line-start", help=
        "where the hole starts: line-start (the hidden line whole, the benchmark as published) or "
        "mid-line (halfway through the line's code, as while typing)")
    p.add_argument(
        "--insert", choices=INSERTS, default="first-line",
        help="first-line: stop at a newline and keep the answer's first line (a client that cuts); "
        "whole: no stop sent, the whole answer spliced in (as Zed does)")
    p.add_argument(
        "--hole", choices=HOLES, default="line", help=
        "line: one hidden line (the benchmark as published); lines: 2-5 consecutive lines hidden")
    p.add_argument("--scope", choices=get_args(CompletionScope),
                   help="warmpath's per-request completion scope (default: the server's)")
    p.add_argument("--api-key", help="sent as Authorization: Bearer")
    p.add_argument("--model", help="the model name to send (default: the first the server lists)")
    p.add_argument("--limit", type=int,
                   help="this many tasks, evenly spread over all 1,033 (default: all)")
    p.add_argument("--max-tokens", type=int, default=64, help="the longest answer per task")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds a completed program may run its tests")
    p.add_argument("--label", default="", help="what was served (goes into --out)")
    p.add_argument("--out", help="JSON file: the summary and every task's completion and result")
    repo.add_arguments(p)


async def evaluate(args: argparse.Namespace) -> int:
    if args.suite == "repo":
        return await repo.evaluate(args)
    make = multi_line_tasks if args.hole == "lines" else single_line_tasks
    tasks = spread(make(fetch_problems()), args.limit)
    if args.cursor == "mid-line":
        tasks = [mid_line(t) for t in tasks]
    literal = args.protocol == FIM_PROMPT
    target = Target(args.target, args.model, args.api_key, "openai" if literal else args.protocol)
    # the answers are the target's code: say how far they are shut in
    sandbox = await asyncio.to_thread(probe)
    print(f"eval sandbox: {sandbox.describe()}", file=sys.stderr)
    clock = monotonic_clock()
    results: list[TaskResult] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as http:
        target.model = target.model or await discover_model(http, target)
        template = detect_fim(model=args.fim_family or target.model or "") if literal else None
        if literal and template is None:
            print(
                f"no FIM template known for {args.fim_family or target.model!r}: pass --fim-family",
                file=sys.stderr)
            return 2
        for i, task in enumerate(tasks):
            rec = RequestRecord(session=f"eval-{i}", kind="agent", sent=clock())
            body = {
                "prompt": task.prefix, "suffix": task.suffix, "max_tokens": args.max_tokens,
                "temperature": 0
            }
            if template is not None:
                # the prompt written out, no suffix field (servers end at the markers)
                body = {
                    "prompt": render(Fill(prefix=task.prefix, suffix=task.suffix), template,
                                     args.fim_layout).text, "max_tokens": args.max_tokens,
                    "temperature": 0
                }
            if args.insert == "first-line":
                body["stop"] = ["\n"]
            if args.scope:
                body["scope"] = args.scope
            await stream_completion(http, target, body, rec, clock)
            middle = rec.text.split("\n", 1)[0] if args.insert == "first-line" else rec.text
            ok = rec.error is None and await asyncio.to_thread(passes, task.program(middle),
                                                               args.timeout)
            results.append(
                TaskResult(task.task_id, middle, ok, (rec.done or clock()) - rec.sent, rec.tokens,
                           rec.error))
            if rec.error:
                print(f"{task.task_id}: {rec.error}", file=sys.stderr)
            if (i + 1) % 50 == 0 or i + 1 == len(tasks):
                done = sum(r.passed for r in results)
                print(f"{i + 1}/{len(tasks)} tasks, pass@1 so far {100 * done / (i + 1):.1f}%",
                      file=sys.stderr)
    passed, errors = sum(r.passed for r in results), sum(r.error is not None for r in results)
    summary = {
        "benchmark": f"HumanEval {'single' if args.hole == 'line' else 'multi'}-line infilling",
        "cursor": args.cursor, "insert": args.insert, "scope": args.scope, "tasks": len(results),
        "passed": passed, "pass_at_1": passed / len(results) if results else 0.0, "errors": errors,
        "target": args.target, "protocol": args.protocol, "model": target.model,
        "label": args.label, "mean_seconds": sum(r.seconds for r in results) / max(1, len(results)),
        "mean_tokens": sum(r.tokens for r in results) / max(1, len(results)),
        "sandbox": asdict(sandbox), "date": time.strftime("%Y-%m-%d")
    }
    print(
        f"pass@1 {100 * summary['pass_at_1']:.1f}% ({passed} of {len(results)} tasks"
        f"{f', {errors} errors' if errors else ''}), {summary['mean_tokens']:.1f} tokens a "
        "request, "
        f"{summary['benchmark']}, {target.model}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**summary, "results": [asdict(r) for r in results]}, f, indent=1)
    return 1 if errors == len(results) else 0
