"""Faults met by real `warmpath serve` processes: killed with SIGKILL while they write (the plan
being measured, KV tier blocks mid-prompt and mid-answer), each restarted on the same $WARMPATH_HOME
and tier; two servers started together on one fresh $WARMPATH_HOME, measuring, building and packing
at the same moment. Each ends with a start that succeeds and greedy answers equal to a fresh
server's. (A power cut, a full disk, a model changed in its middle: test_disk_state.py and
test_kv_tier.py.)"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from engine_checks import code_texts
from server_harness import ServeProcess, counter, running_server, start_serve
from tiny_model import write_tiny_gguf

from warmpath.config import EngineConfig, SchedulerConfig
from warmpath.kernels import build

pytestmark = pytest.mark.server

BLOCK = 16  # tokens per KV block: the servers' default
# Small steps: a prompt of ~2,500 tokens takes ~40 of them, so a kill lands while its blocks are
# being written.
ARGS = ("--num-threads", "1", "--num-kv-blocks", "1024", "--max-num-batched-tokens", "64")
GREEDY = {"max_tokens": 12, "temperature": 0, "logprobs": 1}
REJECTED = "warmpath_kv_tier_rejected_blocks_total"  # tier files found torn, corrupt or foreign


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_tiny_gguf(
        tmp_path_factory.mktemp("faults") / "m.gguf", max_position_embeddings=8192)[0]


@pytest.fixture(scope="module")
def kernel() -> Path:
    """The native kernel as the real compiler builds it here (under the session's home, built
    once)."""
    return build.build_library()


@pytest.fixture(scope="module")
def prompts() -> tuple[str, ...]:
    """Long prompts that share no first block (each tier file is one prompt's)."""
    return tuple(f"# prompt {i}\n{text}"
                 for i, text in enumerate(code_texts(3, 2400, 2600, seed=7)))


def environment(home: Path, kernel: Path, compiles: Path) -> dict[str, str]:
    """The servers' environment: a $WARMPATH_HOME of their own, and a $CC that writes the kernel
    already built (a real compile takes ~15 s) and logs each call."""
    cc = compiles.with_name("cc")
    cc.write_text(
        f'#!/bin/sh\necho "$@" >> {compiles}\nwhile [ $# -gt 1 ]; do [ "$1" = -o ] && out="$2"; '
        'shift; '
        f'done\ncp {kernel} "$out"\nchmod 755 "$out"\n')
    cc.chmod(0o755)
    return {**os.environ, "WARMPATH_HOME": str(home), "CC": str(cc)}


def complete(url: str, prompt: str) -> tuple[list[str], int, int | None]:
    """(the greedy answer's tokens, prompt tokens, prompt tokens read back from the KV tier)"""
    r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, **GREEDY}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    details = body["usage"]["prompt_tokens_details"]
    return body["choices"][0]["logprobs"]["tokens"], body["usage"]["prompt_tokens"], details.get(
        "tier_cached_tokens")


def chosen_plan(server: ServeProcess) -> str:
    """The backend the server's plan (measured, or loaded) chose, from what it printed at its
    start."""
    m = re.search(r"kernel: plan (\S+) \(deterministic", server.output())
    assert m, f"no deterministic plan:\n{server.output()}"
    return m.group(1)


@functools.cache
def fresh_answers(model: Path, plan: str, prompts: tuple[str, ...]) -> list[list[str]]:
    """What a fresh server (no tier, nothing on disk it reads) answers, under the same plan."""
    config = EngineConfig(model=str(model), plan=plan, num_threads=1, num_kv_blocks=1024,
                          scheduler=SchedulerConfig(max_num_batched_tokens=64))
    with running_server(config) as (url, _):
        return [complete(url, p)[0] for p in prompts]


def kill_when(server: ServeProcess, condition: Callable[[], bool], timeout: float = 120.0) -> None:
    """SIGKILL the server the moment `condition` holds (polled every millisecond)."""
    end = time.monotonic() + timeout
    while not condition():
        assert server.proc.poll() is None and time.monotonic(
        ) < end, f"never reached:\n{server.output()}"
        time.sleep(0.001)
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()


def send_in_background(url: str, prompt: str) -> threading.Thread:
    """A long answer streamed to nobody: the request goes on until the server dies."""
    def run() -> None:
        body = {"prompt": prompt, "max_tokens": 400, "temperature": 0, "stream": True}
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
                for _ in r.iter_lines():
                    pass
        except httpx.HTTPError:
            pass  # killed under it

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def kill_mid_answer(server: ServeProcess, prompt: str) -> None:
    """SIGKILL after the answer's second event: its prompt computed, the tier writer may still be
    writing it."""
    body = {"prompt": prompt, "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as r:
        events = 0
        for line in r.iter_lines():
            events += line.startswith("data: ")
            if events == 2:
                server.proc.send_signal(signal.SIGKILL)
                break
    server.proc.wait()


def blocks_on_disk(tier: Path) -> int:
    return sum(1 for _ in tier.rglob("*.kv"))


def temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if p.is_file()]


def settle(server: ServeProcess, tier: Path) -> None:
    """Until every block the server keeps is on disk (its writer has nothing queued)."""
    end = time.monotonic() + 60
    while blocks_on_disk(tier) != counter(server.url, "warmpath_kv_tier_blocks"):
        assert time.monotonic() < end, "the tier writer never caught up"
        time.sleep(0.01)


@dataclass
class Killed:
    """A prompt whose server was killed while it ran: its blocks the writer had put on disk by
    then."""

    prompt: str
    blocks: int


def check_restored(url: str, killed: Killed | None) -> None:
    """The first request after a restart reads back exactly the killed prompt's blocks that reached
    the disk whole (its first `blocks`, in order: the writer keeps the order they were cached
    in)."""
    if killed is None:
        return
    _, prompt_tokens, tier_tokens = complete(url, killed.prompt)
    usable = (prompt_tokens - 1) // BLOCK  # the last token is always computed
    assert tier_tokens == BLOCK * min(killed.blocks, usable)


# When each prompt's server is killed: once this many of its blocks are on disk (None: after its
# answer's second event, the prompt computed, the writer maybe still behind).
MOMENTS = (1, 60, None)


def kill_while_writing(server: ServeProcess, tier: Path, prompt: str, moment: int | None) -> Killed:
    before = blocks_on_disk(tier)
    if moment is None:
        kill_mid_answer(server, prompt)
    else:
        send_in_background(server.url, prompt)
        kill_when(server, lambda: blocks_on_disk(tier) >= before + moment)
    return Killed(prompt, blocks_on_disk(tier) - before)


@pytest.mark.slow
def test_kill_9_mid_write_costs_the_cut_write_only(model, kernel, prompts, tmp_path):
    """SIGKILL while the plan is measured, while a prompt's blocks are written (the first; dozens),
    and while its answer streams: every restart on the same $WARMPATH_HOME and tier starts, finds
    each block that reached the disk whole (and no torn one), and answers as a fresh server does."""
    home, tier = tmp_path / "home", tmp_path / "tier"
    env = environment(home, kernel, tmp_path / "compiles")
    args = ("--model", str(model), "--kv-offload-dir", str(tier), *ARGS)
    servers = [start_serve(*args, env=env)]
    try:
        kill_when(servers[0], lambda: (home / "plans").is_dir())  # mid-measure: no plan written yet
        killed = None
        for prompt, moment in zip(prompts, MOMENTS, strict=True):
            servers.append(server := start_serve(*args, env=env))
            server.wait_serving()
            check_restored(server.url, killed)
            assert counter(server.url, REJECTED) == 0  # no block file was torn
            settle(server, tier)
            killed = kill_while_writing(server, tier, prompt, moment)

        servers.append(last := start_serve(*args, env=env))
        last.wait_serving()
        check_restored(last.url, killed)
        answers = [complete(last.url, p)[0] for p in prompts]
        assert counter(last.url, REJECTED) == 0
        plan = chosen_plan(last)
    finally:
        for s in servers:
            s.stop()
    assert answers == fresh_answers(model, plan, prompts)
    cut = [p for p in temporaries(tier) if p.name.endswith(".tmp")]
    assert len(cut) <= 1 + len(MOMENTS)  # one write cut short per kill at most


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Each file's content digest, and when it was last written: a plan's time aside (a start
    re-saves the same timings where a candidate, such as the bf16 attention beside a tiny head,
    cannot run here)."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(),
                                       0 if p.parent.name == "plans" else p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file()}


def test_two_servers_starting_together_on_one_fresh_home_both_answer_and_leave_it_whole(
        model, kernel, prompts, tmp_path):
    """Both build the kernel, measure the plan and pack the weights at the same moment into one
    fresh $WARMPATH_HOME: both start and answer as a fresh server does, and what they leave is
    whole: a third start reads all of it and writes nothing (no compile, no measuring, no
    packing)."""
    home, compiles = tmp_path / "home", tmp_path / "compiles"
    env = environment(home, kernel, compiles)
    args = ("--model", str(model), *ARGS)
    servers = [start_serve(*args, env=env) for _ in range(2)]
    try:
        for s in servers:
            s.wait_serving()
        answers = [[complete(s.url, p)[0] for p in prompts] for s in servers]
        plans = [chosen_plan(s) for s in servers]
    finally:
        for s in servers:
            s.stop()
    for plan, got in zip(plans, answers, strict=True):
        assert got == fresh_answers(model, plan, prompts)
    kept = snapshot(home)
    assert {"plans", "packed", "kernels"} <= {Path(p).parts[0] for p in kept}
    assert not temporaries(home)  # every write was renamed into place
    builds = compiles.read_text().count("\n")
    assert 1 <= builds <= 2

    third = start_serve(*args, env=env)
    try:
        third.wait_serving()
        assert [complete(third.url, p)[0]
                for p in prompts] == fresh_answers(model, chosen_plan(third), prompts)
    finally:
        third.stop()
    assert snapshot(home) == kept and compiles.read_text().count("\n") == builds
