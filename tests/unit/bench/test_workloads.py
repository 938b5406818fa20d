"""Workload generators: deterministic for a seed, real file text at the cursor, bursty out-of-phase
sessions, agent turns that are mostly byte-identical to the previous one."""

import statistics
import sysconfig
from pathlib import Path

import pytest

from warmpath.workloads import (
    AgentParams,
    EditorParams,
    Trace,
    agent_trace,
    editor_document,
    editor_trace,
    make_trace,
)

STDLIB = Path(sysconfig.get_paths()["stdlib"])
# keys further apart than this are a reading pause (>= 1 s), not typing or a hesitation (<= 0.6 s)
PAUSE = 0.8


def by_session(trace: Trace, kind: str = "key") -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for e in trace.events:
        if e["type"] == kind:
            out.setdefault(e["session"], []).append(e)
    return out


def bursts(keys: list[dict], gap_s: float) -> list[list[dict]]:
    groups = [[keys[0]]]
    for a, b in zip(keys, keys[1:], strict=False):
        if b["t"] - a["t"] > gap_s:
            groups.append([])
        groups[-1].append(b)
    return groups


@pytest.mark.parametrize("workload", ["editor", "agent", "mixed"])
def test_same_seed_same_trace_and_jsonl_round_trip(workload, tmp_path):
    a = make_trace(workload, 4, 120, seed=7, rate=30)
    b = make_trace(workload, 4, 120, seed=7, rate=30)
    c = make_trace(workload, 4, 120, seed=8, rate=30)
    assert a.events and a.events == b.events and a.sessions == b.sessions
    assert a.events != c.events
    a.save(tmp_path / "t.jsonl")
    loaded = Trace.load(tmp_path / "t.jsonl")
    assert loaded.meta == a.meta and loaded.sessions == a.sessions and loaded.events == a.events
    assert [e["t"] for e in a.events] == sorted(e["t"] for e in a.events)


def test_editor_prefix_and_suffix_are_the_real_file_text_at_the_cursor():
    trace = editor_trace(5, 600, seed=3, rate=20)
    keys = [e for e in trace.events if e["type"] == "key"]
    assert len(keys) > 500
    for _sid, session in trace.sessions.items():
        for name, text in session["files"].items():
            assert (STDLIB / name).read_text(encoding="utf-8") == text  # the real file, whole
    for e in keys[::7]:
        real = (STDLIB / e["file"]).read_text(encoding="utf-8")
        prefix, suffix, expected = editor_document(trace, e, 5000, 1000)
        assert real[: e["cursor"]].endswith(prefix)
        assert min(5000, e["cursor"]) <= len(prefix) <= 1.25 * 5000 + 500
        # starts at a line
        assert len(prefix) == e["cursor"] or real[e["cursor"] - len(prefix) - 1] == "\n"
        # the cursor's line ends: new code goes there
        assert suffix == "\n" + real[e["end"]: e["end"] + 999]
        assert e["cursor"] <= e["end"]
        rest = real[e["cursor"]:]
        assert expected in rest and (rest.startswith(expected) or not rest.split("\n")[0].strip())
    # Within one developer's stretch of typing, each key adds the next real characters (cursor only
    # advances).
    for _sid, ks in by_session(trace).items():
        for a, b in zip(ks, ks[1:], strict=False):
            if a["file"] == b["file"] and a["end"] == b["end"]:
                assert b["cursor"] > a["cursor"]


def test_editor_sessions_are_bursty_and_out_of_phase():
    p = EditorParams()
    trace = editor_trace(6, 4 * 3600, seed=11, rate=1.0, params=p)
    starts, quiet_gaps, burst_lengths = [], [], []
    for _sid, keys in by_session(trace).items():
        groups = bursts(keys, gap_s=300)  # nobody reads one line for 5 minutes: a new burst
        starts.append(keys[0]["t"])
        for g in groups[:-1]:  # the last burst may be cut by the end of the trace
            pauses = sum(b["t"] - a["t"] > PAUSE for a, b in zip(g, g[1:], strict=False)) + 1
            # ~10 requests that survive the debounce per burst
            assert pauses == p.requests_per_burst
            burst_lengths.append(g[-1]["t"] - g[0]["t"])
        quiet_gaps += [b[0]["t"] - a[-1]["t"] for a, b in zip(groups, groups[1:], strict=False)]
    assert len(quiet_gaps) >= 20
    assert all(0.6 * p.quiet_s < g < 1.4 * p.quiet_s for g in quiet_gaps)  # ~30 minutes away
    assert 120 < statistics.median(burst_lengths) < 420  # ~4 minutes of activity
    # Out of phase: first bursts spread over the cycle, not all at once.
    assert max(starts) - min(starts) > 0.25 * (p.burst_s + p.quiet_s)
    # Typing is human-paced with hesitations that outlast the debounce (stale requests), and it is
    # not compressed by `rate`.
    gaps = [b["t"] - a["t"] for a, b in zip(trace.events, trace.events[1:], strict=False)
            if a["session"] == b["session"]]
    typing = [g for g in gaps if g < PAUSE]
    assert 0.03 < statistics.median(typing) < 0.08
    assert any(0.075 < g < 0.6 for g in typing)


def test_rate_compresses_idle_time_only():
    slow = editor_trace(3, 3 * 3600, seed=5, rate=1.0)
    fast = editor_trace(3, 3 * 3600 / 30, seed=5, rate=30.0)
    for trace, quiet in ((slow, 1800), (fast, 60)):
        for keys in by_session(trace).values():
            groups = bursts(keys, gap_s=quiet * 0.5)
            gaps = [b[0]["t"] - a[-1]["t"] for a, b in zip(groups, groups[1:], strict=False)]
            assert gaps and all(0.6 * quiet < g < 1.4 * quiet for g in gaps)
    typing = [[b["t"] - a["t"] for a, b in zip(t.events, t.events[1:], strict=False)
               if a["session"] == b["session"] and b["t"] - a["t"] < PAUSE] for t in (slow, fast)]
    assert abs(statistics.median(typing[0]) - statistics.median(typing[1])) < 0.01


def test_agent_turns_grow_a_mostly_identical_context():
    count = len  # characters as "tokens": exact sizes for the test
    p = AgentParams(start_tokens=4000, max_context_tokens=7000, tool_tokens=(150, 600))
    trace = agent_trace(3, 600, seed=2, rate=10, params=p, count_tokens=count)
    turns = by_session(trace, "turn")
    assert len(turns) == 3
    for sid, ts in turns.items():
        prompts = trace.agent_prompts(sid)
        assert ts[0]["new_task"] and len(prompts) > 5
        for turn, prev, cur in zip(ts[1:], prompts, prompts[1:], strict=False):
            assert count(cur) <= p.max_context_tokens + 1000
            if turn["new_task"]:
                assert 0.8 * p.start_tokens <= count(cur) <= p.start_tokens
                continue
            same = len(prev[: turn["keep"]])
            assert cur[:same] == prev[:same] and same >= 0.75 * len(prev)  # byte-identical head
            assert len(cur) > len(prev)  # grows by tool output
            assert turn["after"] > 0
        assert sum(t["new_task"] for t in ts) >= 2  # the context filled up and a new task began


def test_the_prefix_window_start_is_stable_while_typing():
    """Consecutive keys of one stretch share the prompt's start, so a server can reuse the cached
    prefix."""
    trace = editor_trace(4, 300, seed=4, rate=30)
    same = total = 0
    for _sid, keys in by_session(trace).items():
        for a, b in zip(keys, keys[1:], strict=False):
            if a["file"] != b["file"]:
                continue
            pa, _, _ = editor_document(trace, a, 5000, 1000)
            pb, _, _ = editor_document(trace, b, 5000, 1000)
            total += 1
            same += pb.startswith(pa[:-200]) if len(pa) > 200 else 1
    assert total > 200 and same / total > 0.97
