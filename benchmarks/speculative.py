r"""Speculative decoding on and off, side by side in one run, on the bundled model (one engine:
speculation is switched per request, off and on alternating, so both see the same machine state).
Greedy, so both must give the same tokens (checked). Decode tokens/s = tokens after the first / time
from first token to last.

Rows: `edit` (warmpath/edit_workload.py: rewrite a real function with one small change), `agent`
(turns of the agent workload, the session's history feeding the suffix proposer), `free` (chat
"write a poem": nothing to copy), and `concurrent` (16 edit requests at once: the step is
compute-bound, speculation must not cost).

    python benchmarks/speculative.py [--method ngram|suffix] [--edits 6 --agent-turns 6 --free 4]
    python benchmarks/speculative.py --model qwen2.5-coder-1.5b --method draft \
        --draft-model qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from warmpath import LLM, EngineRequest, SamplingParams
from warmpath.config import EngineConfig
from warmpath.edit_workload import edit_tasks
from warmpath.server.chat_template import render_chat
from warmpath.workloads import AgentParams, agent_trace

sys.path.insert(0, str(Path(__file__).parent))
from common import machine, write_json  # noqa: E402

POEMS = [
    "Write a poem about the sea.", "Write a short story about a robot.",
    "Describe a sunset in detail.", "Write a poem about autumn leaves.",
    "Tell a story about a lost cat.", "Write a song about the city."
]


def run(engine, prompts: list[list[int]], max_tokens: list[int], sessions: list[str | None],
        speculate: bool, speculator) -> dict:
    """The prompts at once; per-request decode rates and the totals."""
    engine.speculator = speculator if speculate else None
    before = (speculator.proposed, speculator.accepted)
    ids = []
    for i, (p, m, s) in enumerate(zip(prompts, max_tokens, sessions, strict=True)):
        rid = f"{'on' if speculate else 'off'}-{time.monotonic_ns()}-{i}"
        engine.add_request(
            EngineRequest(rid, p, SamplingParams(max_tokens=m, temperature=0), session_id=s))
        ids.append(rid)
    t0, outs = time.perf_counter(), {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                outs[o.request_id] = o
    wall = time.perf_counter() - t0
    decode_s = sum(outs[r].metrics.finish_time - outs[r].metrics.first_token_time for r in ids)
    tokens = sum(len(outs[r].token_ids) - 1 for r in ids)
    return {
        "tokens": [outs[r].token_ids for r in ids], "decode_tokens": tokens, "decode_s": decode_s,
        "wall_s": wall, "output_tokens": sum(len(outs[r].token_ids) for r in ids),
        "proposed": speculator.proposed - before[0], "accepted": speculator.accepted - before[1]
    }


def compare(engine, speculator, name: str, batches: list[tuple[list[list[int]], list[int],
                                                               list[str | None]]],
            concurrent: bool = False, repeat: int = 1) -> dict:
    off, on = [], []
    if concurrent:  # wall time counts the prompts too: both runs over a warm prefix cache
        for prompts, _, sessions in batches:
            run(engine, prompts, [1] * len(prompts), sessions, False, speculator)
    for i, (prompts, max_tokens, sessions) in enumerate(batches * repeat):
        order = (False, True) if i % 2 == 0 else (True, False)  # alternate which goes first
        got = {s: run(engine, prompts, max_tokens, sessions, s, speculator) for s in order}
        if got[False]["tokens"] != got[True]["tokens"]:
            raise AssertionError(f"{name}: speculation changed greedy tokens")
        off.append(got[False])
        on.append(got[True])

    def rate(rs: list[dict]) -> float:
        if concurrent:
            return sum(r["output_tokens"] for r in rs) / sum(r["wall_s"] for r in rs)
        return sum(r["decode_tokens"] for r in rs) / sum(r["decode_s"] for r in rs)

    proposed, accepted = sum(r["proposed"] for r in on), sum(r["accepted"] for r in on)
    row = {
        "off_tok_s": rate(off), "on_tok_s": rate(on), "speedup": rate(on) / rate(off),
        "acceptance": accepted / proposed if proposed else None, "proposed": proposed,
        "accepted": accepted, "requests": sum(len(b[0]) for b in batches),
        "output_tokens": sum(r["output_tokens"] for r in on), "identical": True
    }
    acc = "-" if row["acceptance"] is None else f"{100 * row['acceptance']:.0f}%"
    print(
        f"| {name} | {row['off_tok_s']:.1f} | {row['on_tok_s']:.1f} | {row['speedup']:.2f}x | "
        f"{acc} |",
        flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", default="ngram", choices=["ngram", "suffix", "draft"])
    p.add_argument("--draft-model", default=None,
                   help="with --method draft: the model that guesses (same tokenizer)")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--num-speculative-tokens", type=int,
                   default=EngineConfig.num_speculative_tokens)
    p.add_argument("--edits", type=int, default=6)
    p.add_argument("--agent-turns", type=int, default=6)
    p.add_argument("--free", type=int, default=4)
    p.add_argument("--concurrent", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument(
        "--repeat", type=int, default=1,
        help="run every batch this many times, alternating which of "
        "on and off goes first (a single pair varies by +-15%% on a shared 2-core VM)")
    p.add_argument("--out", default="benchmarks/results/speculative.json")
    a = p.parse_args()
    llm = LLM(a.model, speculative_method=a.method, num_speculative_tokens=a.num_speculative_tokens,
              speculative_draft_model=a.draft_model)
    engine = llm.engine
    speculator, tok = engine.speculator, engine.tokenizer

    def chat(messages: list[dict]) -> list[int]:
        return tok.encode(render_chat(tok, messages))

    edits = [chat(t.messages()) for t in edit_tasks(a.edits + a.concurrent, seed=1)]
    trace = agent_trace(
        1, 10_000, seed=2, params=AgentParams(start_tokens=1500, max_context_tokens=3000,
                                              max_tokens=a.max_tokens // 2),
        count_tokens=lambda s: len(tok.encode(s)))
    turns, prompt = [], ""
    for e in trace.events:
        prompt = prompt[: e["keep"]] + e["add"]
        turns.append(tok.encode(prompt))
        if len(turns) == a.agent_turns:
            break
    print(
        f"speculative decoding ({a.method}, up to {a.num_speculative_tokens} guesses) vs off, "
        f"{a.model}, greedy; "
        f"{machine()}")
    print("| workload | off tok/s | on tok/s | speed-up | acceptance |\n|---|---|---|---|---|")
    rows = {
        "edit": compare(engine, speculator, "edit (rewrite a function)",
                        [([x], [a.max_tokens], [None]) for x in edits[:a.edits]], repeat=a.repeat),
        "agent": compare(engine, speculator, "agent turns",
                         [([x], [a.max_tokens // 2], ["agent"]) for x in turns], repeat=a.repeat),
        "free": compare(engine, speculator, "free generation (chat)",
                        [([chat([{"role": "user", "content": q}])], [a.max_tokens // 2], [None])
                         for q in POEMS[:a.free]], repeat=a.repeat),
        "concurrent": compare(
            engine, speculator, f"{a.concurrent} concurrent edits (aggregate)",
            [(edits[a.edits:], [a.max_tokens // 2] * a.concurrent, [None] * a.concurrent)],
            concurrent=True, repeat=2 * a.repeat),
    }
    write_json(
        a.out, {
            "command": " ".join(["python", *sys.argv]), "machine": machine(), "method": a.method,
            "model": a.model, "draft_model": a.draft_model,
            "num_speculative_tokens": a.num_speculative_tokens, "repeat": a.repeat, "rows": rows
        })
    return 0


if __name__ == "__main__":
    sys.exit(main())
