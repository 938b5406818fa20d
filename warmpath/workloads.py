"""Real-code workloads shared by `warmpath bench` and `warmpath simulate`: deterministic for a seed,
saved and replayed as JSONL traces.

editor  Developers typing real text into real files (the Python standard library on this machine). A
        developer picks a file and a spot and types the text that really follows, at a human pace:
        fast keys inside a word, sometimes a short hesitation between words (long enough for the
        client's debounce to fire, so the request it sends goes stale at the next key), and a longer
        pause after each stretch of typing (the request that survives). About 10 such pauses in ~4
        minutes, then ~30 minutes away; developers start out of phase. Coming back, a developer
        usually continues in the same file (a warm prefix, if it survived).
agent   Coding-agent turns over a long context (4k-7k tokens by default) that grows each turn by
        tool output (real file text), the rest byte-identical to the previous turn except,
        sometimes, an edit near the end. When the context is full the agent starts a new task (a
        cold prefill). Turns are closed-loop: the next one is sent `after` seconds once the previous
        answer is complete.
mixed   Both, `agent_share` of the sessions being agents.

`rate` compresses only idle time (reading pauses, the ~30 minutes away, the gap between agent
tasks): typing speed and debounce stay human, so a short run keeps the same request pattern per
burst. Reports say the factor.

Trace (JSONL): a header line {"type": "trace", ...params}, one {"type": "session", ...} line per
session (an editor session carries its file's text; an agent session nothing), then events ordered
by time:
  {"type": "key", "t", "session", "cursor", "end"}: after this keystroke the developer's document is
      text[:cursor] + text[end:], with the cursor between the two; text[cursor:end] is what they
      have not typed yet (so the real next line is known).
  {"type": "turn", "t", "session", "keep", "add", "after", "max_tokens", "new_task"}: the agent's
      prompt is the previous prompt[:keep] + add; `t` is the earliest send time, `after` the think
      time after the previous turn of that session completes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

WORKLOADS = ("editor", "agent", "mixed")
# the bundled tokenizer's median over standard-library files: sizes agent contexts without it
CHARS_PER_TOKEN = 3.9


@dataclass
class EditorParams:
    requests_per_burst: int = 10  # pauses (surviving requests) per burst
    burst_s: float = 240.0  # a burst lasts ~4 minutes
    quiet_s: float = 1800.0  # then ~30 minutes away
    return_to_file: float = 0.7  # chance the next burst continues in the same file
    # sent before the cursor: 5,000-6,250 chars (~1,300-1,600 tokens of code)
    prefix_chars: int = 5000
    suffix_chars: int = 1000  # sent after the region still to type
    min_prefix_chars: int = 2000  # a spot with real context above it
    key_median_s: float = 0.045  # fast keys inside a word
    hesitate_p: float = 0.2  # chance of a hesitation between words ...
    # ... of this long (> debounce: a request that goes stale)
    hesitate_s: tuple[float, float] = (0.1, 0.6)
    max_tokens: int = 16


@dataclass
class AgentParams:
    start_tokens: int = 4000
    max_context_tokens: int = 7000
    tool_tokens: tuple[int, int] = (150, 600)  # tool output added per turn
    edit_p: float = 0.3  # chance a turn also edits a line near the end of the context
    think_s: tuple[float, float] = (0.5, 3.0)  # tool execution between turns (not compressed)
    task_gap_s: float = 120.0  # between tasks (compressed by rate)
    max_tokens: int = 48


@dataclass
class Trace:
    meta: dict
    sessions: dict[str, dict] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)

    def save(self, path: str | Path) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps({"type": "trace", **self.meta}) + "\n")
            for s in self.sessions.values():
                f.write(json.dumps({"type": "session", **s}) + "\n")
            for e in self.events:
                f.write(json.dumps(e) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        trace = cls(meta={})
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            kind = rec.pop("type")
            if kind == "trace":
                trace.meta = rec
            elif kind == "session":
                trace.sessions[rec["session"]] = rec
            else:
                trace.events.append({"type": kind, **rec})
        return trace

    @property
    def editor_window(self) -> tuple[int, int]:
        """(prefix_chars, suffix_chars): how much text around the cursor this trace's editor
        sends."""
        p = self.meta.get("editor") or {}
        return (int(p.get("prefix_chars", EditorParams.prefix_chars)),
                int(p.get("suffix_chars", EditorParams.suffix_chars)))

    def agent_turns(self) -> dict[str, list[dict]]:
        """Each agent session's turn events in order, each with its full `prompt` (the previous
        turn's prompt[:keep] + add)."""
        turns: dict[str, list[dict]] = {}
        for e in self.events:
            if e["type"] == "turn":
                mine = turns.setdefault(e["session"], [])
                prompt = (mine[-1]["prompt"] if mine else "")[: e["keep"]] + e["add"]
                mine.append({**e, "prompt": prompt})
        return turns

    def agent_prompts(self, session: str) -> list[str]:
        """The full prompt of each turn of an agent session, in order."""
        return [t["prompt"] for t in self.agent_turns().get(session, [])]


def _plain(params) -> dict:
    """Parameters as they read back from JSON (tuples become lists), so a loaded trace equals the
    original."""
    return json.loads(json.dumps(dataclasses.asdict(params)))


# -- real source files -----------------------------------------------------------------------------
@cache
def stdlib_files(min_chars: int = 8000) -> tuple[Path, ...]:
    """Pure-Python standard-library modules big enough to type into, in a stable order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for p in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if p.parent.name in ("site-packages", "test", "tests",
                             "unittest") or p.name.startswith("test"):
            continue
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) >= min_chars and text.isascii():
            files.append(p)
    return tuple(files)


def _relative(path: Path) -> str:
    return str(path.relative_to(Path(sysconfig.get_paths()["stdlib"])))


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def next_line(text_after_cursor: str) -> str:
    """The real line the developer types next: the rest of the cursor's line, or the following line
    if the rest is blank."""
    rest, _, tail = text_after_cursor.partition("\n")
    if rest.strip():
        return rest
    return tail.partition("\n")[0]


# -- editor ----------------------------------------------------------------------------------------
def _type_stretch(rng: random.Random, text: str, cursor: int, t: float,
                  p: EditorParams) -> tuple[list, int, float]:
    """Keystrokes for one stretch of typing from `cursor` (to the end of the line, or a few words of
    a long one). A newline and the indentation after it are one key (the editor auto-indents)."""
    line_end = text.find("\n", cursor)
    line_end = len(text) if line_end < 0 else line_end + 1
    stop = line_end if line_end - cursor <= 60 else cursor + rng.randint(15, 40)
    keys = []
    i = cursor
    while i < stop:
        ch = text[i]
        i += 1
        if ch == "\n":
            while i < len(text) and text[i] in " \t":
                i += 1
        dt = min(0.4, max(0.02, rng.lognormvariate(math.log(p.key_median_s), 0.35)))
        if ch in " (.,:" and rng.random() < p.hesitate_p:
            dt = rng.uniform(*p.hesitate_s)
        t += dt
        keys.append((t, i))
    return keys, i, t


def _editor_session(sid: str, rng: random.Random, duration_s: float, rate: float, p: EditorParams,
                    files: tuple[Path, ...]) -> tuple[dict, list[dict]]:
    cycle = (p.burst_s + p.quiet_s) / rate
    t = rng.uniform(0, cycle)  # out of phase
    path, text, cursor, events = None, "", 0, []
    texts: dict[str, str] = {}
    pause_mean = p.burst_s / p.requests_per_burst / rate
    while t < duration_s:
        if path is None or rng.random() >= p.return_to_file or cursor > len(text) - 3000:
            path = rng.choice(files)
            text = texts.setdefault(_relative(path), _read(path))
            starts = [i + 1 for i in range(p.min_prefix_chars, len(text) - 3000) if text[i] == "\n"]
            cursor = rng.choice(starts) if starts else p.min_prefix_chars
            while text[cursor] in " \t":  # start typing where the line's code starts
                cursor += 1
        # the region typed in this burst, bounded so the suffix after it is real
        end = min(len(text), cursor + 60 * (p.requests_per_burst + 2) + 400)
        end = text.find("\n", end) + 1 or len(text)
        for _ in range(p.requests_per_burst):
            if cursor >= end or t >= duration_s:
                break
            keys, cursor, t = _type_stretch(rng, text, cursor, t, p)
            events += [{"type": "key", "t": round(kt, 4), "session": sid, "file": _relative(path),
                        "cursor": c, "end": end} for kt, c in keys]
            # reading, thinking: the request that survives
            t += max(1.0, rng.expovariate(1 / pause_mean))
        t += rng.uniform(0.7, 1.3) * p.quiet_s / rate
    # Sessions carry the text of every file they typed into (keys name theirs).
    used = sorted({e["file"] for e in events})
    return {"session": sid, "kind": "editor", "files": {f: texts[f] for f in used}}, events


def editor_trace(developers: int, duration_s: float, seed: int = 0, rate: float = 1.0,
                 params: EditorParams | None = None) -> Trace:
    p = params or EditorParams()
    files = stdlib_files()
    trace = Trace(
        meta={
            "workload": "editor", "developers": developers, "duration_s": duration_s, "seed": seed,
            "rate": rate, "editor": _plain(p)
        })
    for d in range(developers):
        sid = f"dev-{d:03d}"
        session, events = _editor_session(sid, random.Random(f"{seed}/editor/{d}"), duration_s,
                                          rate, p, files)
        trace.sessions[sid] = session
        trace.events += events
    trace.events.sort(key=lambda e: (e["t"], e["session"]))
    return trace


def prefix_start(text: str, cursor: int, prefix_chars: int) -> int:
    """Where the prompt's prefix window starts: a line start that moves in steps of a quarter
    window, so the window holds prefix_chars to 1.25x that (plus the rest of a line). A window
    sliding with every keystroke would change the prompt's first tokens each time and no server
    could reuse a cached prefix; a stable start keeps it warm."""
    if cursor <= prefix_chars:
        return 0
    step = max(1, prefix_chars // 4)
    start = (cursor - prefix_chars) // step * step
    return text.rfind("\n", 0, start) + 1  # the start of the line holding the grid point


def editor_prompt(trace: Trace, key: dict, prefix_chars: int | None = None,
                  suffix_chars: int | None = None) -> tuple[str, str]:
    """(prefix before the cursor, suffix after the untyped region) for a key event; the window's
    sizes default to the trace's (Trace.editor_window). The developer writes the region as new code:
    in the buffer the cursor's line ends at the cursor, and the code after the region follows on the
    next line."""
    default_prefix, default_suffix = trace.editor_window
    prefix_chars = default_prefix if prefix_chars is None else prefix_chars
    suffix_chars = default_suffix if suffix_chars is None else suffix_chars
    text = trace.sessions[key["session"]]["files"][key["file"]]
    cursor, end = key["cursor"], key["end"]
    start = prefix_start(text, cursor, prefix_chars)
    return text[start:cursor], "\n" + text[end: end + suffix_chars - 1]


def editor_document(trace: Trace, key: dict, prefix_chars: int | None = None,
                    suffix_chars: int | None = None) -> tuple[str, str, str]:
    """(prefix before the cursor, suffix after the untyped region, the real next line) for a key
    event."""
    prefix, suffix = editor_prompt(trace, key, prefix_chars, suffix_chars)
    text = trace.sessions[key["session"]]["files"][key["file"]]
    return prefix, suffix, next_line(text[key["cursor"]:])


# -- agent -----------------------------------------------------------------------------------------
def _agent_session(sid: str, rng: random.Random, duration_s: float, rate: float, p: AgentParams,
                   files: tuple[Path, ...], count_tokens: Callable[[str], int]) -> list[dict]:
    def file_chunk(n_tokens: int) -> str:
        path = rng.choice(files)
        text = _read(path)
        n_chars = int(n_tokens * CHARS_PER_TOKEN)
        start = rng.randrange(0, max(1, len(text) - n_chars))
        start = text.rfind("\n", 0, start) + 1
        chunk = text[start: start + n_chars]
        return f"\n### tool: read {_relative(path)}\n{chunk[: chunk.rfind(chr(10)) + 1]}"

    def fit(s: str, n_tokens: int) -> str:
        while count_tokens(s) > n_tokens:  # estimate was off for this file: cut by lines
            s = s[: s.rfind("\n", 0, int(len(s) * 0.95)) + 1]
        return s

    t = rng.uniform(0, p.task_gap_s / rate)
    events, prompt, task = [], "", 0
    while t < duration_s:
        if not prompt or count_tokens(prompt) > p.max_context_tokens:
            task += 1
            new = fit(
                f"# Agent task {sid}/{task}: fix the failing test and explain the change.\n" +
                "".join(file_chunk(800) for _ in range(p.start_tokens // 800 + 1)), p.start_tokens)
            if prompt:
                t += rng.uniform(0.7, 1.3) * p.task_gap_s / rate
            events.append({"type": "turn", "t": round(t, 4), "session": sid, "keep": 0, "add": new,
                           "after": 0.0, "max_tokens": p.max_tokens, "new_task": True})
            prompt = new
            continue
        keep = len(prompt)
        add = ""
        if rng.random() < p.edit_p:  # an edit to a line in the last fifth of the context
            lo = prompt.find("\n", int(len(prompt) * 0.8)) + 1
            line_end = prompt.find("\n", lo)
            if 0 < lo < line_end:
                keep = lo
                add = prompt[lo:line_end] + "  # edited\n" + prompt[line_end + 1:]
        add += file_chunk(rng.randint(*p.tool_tokens))
        after = rng.uniform(*p.think_s)
        t += after
        budget = p.max_context_tokens + 1000
        nxt = fit(prompt[:keep] + add, budget)
        events.append({
            "type": "turn", "t": round(t, 4), "session": sid, "keep": keep, "add": nxt[keep:],
            "after": round(after, 4), "max_tokens": p.max_tokens, "new_task": False
        })
        prompt = nxt
    return events


def agent_trace(agents: int, duration_s: float, seed: int = 0, rate: float = 1.0,
                params: AgentParams | None = None, count_tokens: Callable[[str], int] | None = None,
                first_index: int = 0) -> Trace:
    p = params or AgentParams()
    count = count_tokens or (lambda s: math.ceil(len(s) / CHARS_PER_TOKEN))
    trace = Trace(
        meta={
            "workload": "agent", "agents": agents, "duration_s": duration_s, "seed": seed,
            "rate": rate, "agent": _plain(p)
        })
    for a in range(first_index, first_index + agents):
        sid = f"agent-{a:03d}"
        trace.sessions[sid] = {"session": sid, "kind": "agent"}
        trace.events += _agent_session(sid, random.Random(f"{seed}/agent/{a}"), duration_s, rate, p,
                                       stdlib_files(), count)
    trace.events.sort(key=lambda e: (e["t"], e["session"]))
    return trace


def make_trace(workload: str, sessions: int, duration_s: float, seed: int = 0, rate: float = 1.0,
               agent_share: float = 0.25, count_tokens: Callable[[str], int] | None = None,
               editor: EditorParams | None = None, agent: AgentParams | None = None) -> Trace:
    if workload == "editor":
        return editor_trace(sessions, duration_s, seed, rate, editor)
    if workload == "agent":
        return agent_trace(sessions, duration_s, seed, rate, agent, count_tokens)
    if workload != "mixed":
        raise ValueError(f"unknown workload {workload!r}; choose one of {', '.join(WORKLOADS)}")
    n_agents = round(sessions * agent_share)
    ed = editor_trace(sessions - n_agents, duration_s, seed, rate, editor)
    ag = agent_trace(n_agents, duration_s, seed, rate, agent, count_tokens)
    trace = Trace(meta={**ed.meta, **ag.meta, "workload": "mixed", "agent_share": agent_share},
                  sessions={**ed.sessions, **ag.sessions}, events=ed.events + ag.events)
    trace.events.sort(key=lambda e: (e["t"], e["session"]))
    return trace
