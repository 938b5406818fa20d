"""`warmpath eval --suite repo`: completion quality on real repositories, as an editor inserts it.

The holes (eval/holes.py) of the pinned projects' files (eval/corpus.py) go to a server one at a
time, as an editor sends them (eval/editors.py: llama.vim's /infill by default), and each answer is
judged as that editor inserts it (eval/judge.py). Any server can be the target: `warmpath serve`,
`warmpath route` in front of any engine, llama.cpp's llama-server. Reported per language and kind of
hole, for the projects first published before and since 2025, and for the cross-file slice with and
without the defining file as context: exact match as inserted, first-line exact match, edit
similarity, characters inserted, latency."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import httpx

from warmpath.client.completion import Target, discover_model
from warmpath.eval.corpus import PROJECTS, load, neighbours
from warmpath.eval.editors import CLIENTS, Client, Insertion
from warmpath.eval.holes import KINDS, Hole, cross_file_holes, file_holes
from warmpath.eval.judge import judge
from warmpath.stats import percentile

SLICES = ("main", "cross-file")
# projects first published this year or later were not in Qwen2.5-Coder's training data
NEW_SINCE = 2025


@dataclass
class HoleResult:
    id: str
    project: str
    since: int
    language: str
    kind: str
    slice: str
    middle: str
    answer: str  # the server's text
    inserted: str  # what the editor put in the buffer ("" when it discarded the answer)
    exact: bool
    newline_cut: bool  # exact as a client that cuts at the newline inserts it
    first_line: bool  # the first line right
    similarity: float
    chars: int
    seconds: float
    finish: str | None = None  # the server's finish reason, where it says one
    # warmpath's confidence gate's judgement of the answer, where it says one
    confidence: float | None = None
    error: str | None = None


def holes(languages: Iterable[str] | None = None, kinds: Iterable[str] | None = None,
          slices: Iterable[str] = SLICES, projects: Iterable[str] | None = None) -> list[Hole]:
    """The set: every pinned project's holes, file by file in order (consecutive holes share a file,
    as an editor's requests do), then the cross-file slice."""
    languages, kinds, projects = set(languages or ()), set(kinds or ()), set(projects or ())
    main, cross = [], []
    for project in PROJECTS:
        if projects and project.name not in projects:
            continue
        files = load(project)
        if "main" in slices:
            main += [h for f in files for h in file_holes(f)]
        if "cross-file" in slices:
            cross += cross_file_holes(files, neighbours(project))
    return [
        h for h in main + cross
        if (not languages or h.language in languages) and (not kinds or h.kind in kinds)
    ]


def spread(items: list, limit: int | None) -> list:
    if limit is None or limit >= len(items):
        return items
    return [items[k * len(items) // limit] for k in range(limit)]


class Asker:
    """Sends a hole as the client sends it, over HTTP; the answer's text, the finish reason and the
    confidence the server gives."""

    def __init__(self, http: httpx.AsyncClient, target: Target, client: Client):
        self.http, self.target, self.client = http, target, client

    async def ask(self, hole: Hole) -> tuple[str, str | None, float | None]:
        extra = [{"filename": path, "text": text} for path, text in hole.extra]
        headers = {**self.target.headers(), "X-Session-Id": f"eval/{hole.project}/{hole.path}"}
        url, body = self.target.root + self.client.path, self.client.body(
            hole, self.target.model, extra)
        if body.get("stream"):
            return await self._stream(url, body, headers)
        r = await self.http.post(url, json=body, headers=headers)
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
        data = r.json()
        if "content" in data or "choices" not in data:  # llama.cpp's /infill
            return data.get(
                "content",
                ""), data.get("finish_reason") or data.get("stop_type"), data.get("confidence")
        choice = (data.get("choices") or [{}])[0]
        return choice.get("text") or "", choice.get("finish_reason"), choice.get("confidence")

    async def _stream(self, url: str, body: dict,
                      headers: dict) -> tuple[str, str | None, float | None]:
        text, finish, confidence = [], None, None
        async with self.http.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
            async for line in r.aiter_lines():
                data = line.removeprefix("data:").strip()
                if not line.startswith("data:") or data == "[DONE]":
                    continue
                chunk = json.loads(data)
                for choice in chunk.get("choices") or []:
                    text.append(choice.get("text") or "")
                    finish = choice.get("finish_reason") or finish
                    confidence = choice.get("confidence", confidence)
        return "".join(text), finish, confidence


async def run(target: Target, name: str, the_holes: list[Hole], timeout: float = 120.0,
              progress: bool = True) -> list[HoleResult]:
    """Each hole asked as the client `name` asks it and judged as it inserts the answer, one at a
    time."""
    results: list[HoleResult] = []
    client = CLIENTS[name]
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout)) as http:
        if target.model is None:
            target.model = await discover_model(http, target)
        if client.path is None:
            from warmpath.eval.lsp_client import LspAsker
            asker = LspAsker(target)
            await asker.start()
        else:
            asker = Asker(http, target, client)
        try:
            for i, hole in enumerate(the_holes):
                t0, error, answer, finish, confidence = time.monotonic(), None, "", None, None
                try:
                    answer, finish, confidence = await asker.ask(hole)
                except (httpx.HTTPError, RuntimeError, ValueError) as e:
                    error = str(e) or repr(e)
                seconds = time.monotonic() - t0
                ins = client.insert(hole, answer) if error is None else Insertion("")
                v = judge(hole, ins)
                results.append(
                    HoleResult(hole.id, hole.project, hole.since, hole.language, hole.kind,
                               hole.slice or "main", hole.middle, answer, ins.text, v.exact,
                               v.newline_cut, v.first_line, v.similarity, v.chars, seconds, finish,
                               confidence, error))
                if progress and ((i + 1) % 50 == 0 or i + 1 == len(the_holes)):
                    main = [r for r in results if r.slice == "main"] or results
                    print(
                        f"{i + 1}/{len(the_holes)} holes, exact so far "
                        f"{100 * mean(r.exact for r in main):.1f}%",
                        file=sys.stderr, flush=True)
        finally:
            if client.path is None:
                await asker.stop()
    return results


def mean(values: Iterable) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def row(results: list[HoleResult]) -> dict:
    """One table row: counts and means of a group of results."""
    return {
        "holes": len(results), "exact": mean(r.exact for r in results),
        "newline_cut": mean(r.newline_cut for r in results), "first_line": mean(r.first_line
                                                                                for r in results),
        "similarity": mean(r.similarity for r in results), "chars": mean(r.chars for r in results),
        "p50_s": percentile([r.seconds for r in results], 50) if results else 0.0,
        "errors": sum(r.error is not None for r in results)
    }


def summarize(results: list[HoleResult]) -> dict:
    main = [r for r in results if r.slice == "main"]
    langs = sorted({r.language for r in main})
    out = {
        "overall": row(main),
        "by_language": {lang: row([r for r in main if r.language == lang])
                        for lang in langs}, "by_kind": {
                            k: row([r for r in main if r.kind == k])
                            for k in KINDS if any(r.kind == k for r in main)
                        },
        "by_language_kind": {
            f"{lang}/{k}": row([r for r in main if r.language == lang and r.kind == k])
            for lang in langs
            for k in KINDS if any(r.language == lang and r.kind == k for r in main)
        }, "by_age": {
            f"since {NEW_SINCE}": row([r for r in main if r.since >= NEW_SINCE]),
            f"before {NEW_SINCE}": row([r for r in main if r.since < NEW_SINCE])
        }
    }
    cross = [r for r in results if r.slice.startswith("cross-file")]
    if cross:
        out["cross_file"] = {
            s: row([r for r in cross if r.slice == s])
            for s in ("cross-file", "cross-file+context")
        }
    if any(r.confidence is not None for r in main):
        out["confidence"] = confidence_curve(main)
    return out


THRESHOLDS = (0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def confidence_curve(results: list[HoleResult]) -> list[dict]:
    """What a confidence gate at each threshold would do to these answers (all asked with the gate
    open): the share of answers shown, the exact share of those shown, and per 100 requests the
    right and the wrong ones shown (an answer the editor discarded, or an empty one, shows nothing
    either way)."""
    curve = []
    for t in THRESHOLDS:
        shown = [r for r in results if r.inserted and (r.confidence is None or r.confidence >= t)]
        right = sum(r.exact for r in shown)
        curve.append({"threshold": t, "shown": len(shown) / max(1, len(results)),
                      "exact_of_shown": right / max(1, len(shown)),
                      "right_per_100": 100 * right / max(1, len(results)),
                      "wrong_per_100": 100 * (len(shown) - right) / max(1, len(results))})
    return curve


def table(summary: dict) -> str:
    """The summary as a markdown table."""
    lines = [
        "| group | holes | exact as inserted | exact, newline cut | first line right | edit "
        "similarity | chars | "
        "p50 s |", "|---|---|---|---|---|---|---|---|"
    ]

    def add(name: str, r: dict) -> None:
        lines.append(
            f"| {name} | {r['holes']} | {100 * r['exact']:.1f}% | {100 * r['newline_cut']:.1f}% | "
            f"{100 * r['first_line']:.1f}% | {r['similarity']:.3f} | {r['chars']:.0f} | "
            f"{r['p50_s']:.2f} |"
        )

    add("**all**", summary["overall"])
    for section in ("by_language", "by_kind", "by_age", "cross_file", "by_language_kind"):
        for name, r in summary.get(section, {}).items():
            add(name, r)
    if "confidence" in summary:
        lines += ["", "| min confidence | shown | exact of shown | right per 100 | wrong per 100 |",
                  "|---|---|---|---|---|"]
        lines += [
            f"| {c['threshold']:.2f} | {100 * c['shown']:.1f}% | {100 * c['exact_of_shown']:.1f}% "
            "| "
            f"{c['right_per_100']:.1f} | {c['wrong_per_100']:.1f} |" for c in summary["confidence"]
        ]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--client", choices=list(CLIENTS), default="llama.vim", help=
        "repo suite: the editor whose request and insertion are replayed (default llama.vim's "
        "/infill)"
    )
    p.add_argument(
        "--languages",
        help="repo suite: comma-separated languages (python,javascript,typescript,go,rust)")
    p.add_argument("--kinds", help=f"repo suite: comma-separated kinds of hole ({','.join(KINDS)})")
    p.add_argument("--slices", default=",".join(SLICES),
                   help="repo suite: main, cross-file, or both")
    p.add_argument("--projects",
                   help="repo suite: comma-separated project names (default: all pinned)")


async def evaluate(args: argparse.Namespace) -> int:
    split = lambda s: [x for x in (s or "").split(",") if x]  # noqa: E731
    the_holes = spread(
        holes(split(args.languages), split(args.kinds), split(args.slices), split(args.projects)),
        args.limit)
    target = Target(args.target, args.model, args.api_key, "openai")
    results = await run(target, args.client, the_holes)
    summary = summarize(results)
    print(table(summary))
    errors = sum(r.error is not None for r in results)
    if errors:
        print(
            f"{errors} of {len(results)} requests failed, e.g. "
            f"{next(r.error for r in results if r.error)}",
            file=sys.stderr)
    if args.out:
        meta = {
            "suite": "repo", "client": args.client, "target": args.target, "model": target.model,
            "label": args.label, "date": time.strftime("%Y-%m-%d")
        }
        with open(args.out, "w") as f:
            json.dump({**meta, "summary": summary, "results": [asdict(r) for r in results]}, f,
                      indent=1)
    return 1 if results and errors == len(results) else 0
