"""A cold file answered at once (engine/scheduler/_short_context.py): a request whose whole prompt
the cache holds too little of to give a first token by its short context's `by` is answered from
that short context, and its whole prompt computes on as its session's warm-up in steps with nothing
else; the next keystroke, once that is cached, is answered from the whole prompt."""

from warmpath.config import SchedulerConfig
from warmpath.engine.block_pool import BlockPool
from warmpath.engine.request import (
    FinishReason,
    Request,
    RequestMetrics,
    SamplingParams,
    ShortContext,
)
from warmpath.engine.scheduler import Scheduler
from warmpath.engine.step_cost import StepCost

FILE = list(range(1000, 2500))  # a cold file's whole prompt: 1,500 tokens
SHORT = list(range(2200, 2500))  # its short context: the 300 tokens nearest the cursor


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def scheduler() -> tuple[Scheduler, Clock]:
    """2.5 ms a prompt token (a 1,500-token file: 3.75 s; its short context 0.75 s), no overhead."""
    cost, clock = StepCost(), Clock()
    cost.record(512, 512 * 0.0025)
    return Scheduler(SchedulerConfig(512, 64, 0.0), BlockPool(512, 16, True, b"test"), cost,
                     clock=clock), clock


def keystroke(rid: str, prompt: list[int], by: float | None, deadline: float | None = None,
              short: list[int] = SHORT) -> Request:
    return Request(rid, list(prompt), SamplingParams(max_tokens=1, temperature=0), frozenset(), 1,
                   None, RequestMetrics(arrival_time=0.0), "alice", deadline=deadline,
                   short=None if by is None else ShortContext(short, by))


def run(s: Scheduler) -> list[list[tuple[str, int]]]:
    """Every step until nothing is left: (request id, tokens) per step."""
    steps = []
    while s.has_unfinished():
        batch = s.schedule()
        steps.append([(c.request.request_id, c.num_tokens) for c in batch.chunks])
        s.update(batch, [[7] for c in batch.chunks if c.sample])
    return steps


def test_a_cold_file_is_answered_from_its_short_context_while_the_whole_file_warms_after_it():
    s, clock = scheduler()
    req = keystroke("k1", FILE, by=clock.t + 0.3, deadline=clock.t + 3.0)
    s.add(req)
    steps = run(s)
    # the short context alone answers (300 tokens), then the file computes in steps with nothing
    # else: its full blocks, 1,488 tokens
    assert steps[0] == [("k1", 300)] and req.prompt_token_ids == SHORT
    assert req.finish_reason == FinishReason.LENGTH and req.output_token_ids == [7]
    assert all(rid == "k1/warm" for step in steps[1:] for rid, _ in step)
    assert sum(n for step in steps[1:] for _, n in step) == 1488
    # the next keystroke finds the file cached: answered from the whole prompt
    nxt = keystroke("k2", FILE + [9], by=clock.t + 0.3, deadline=clock.t + 3.0)
    s.add(nxt)
    assert run(s)[0] == [("k2", 13)] and nxt.prompt_token_ids == FILE + [9]
    assert nxt.num_cached_tokens == 1488


def test_a_prompt_that_answers_in_time_keeps_its_whole_context():
    s, clock = scheduler()
    short_file = FILE[:100]  # 0.25 s: within the 0.3 s
    req = keystroke("k", short_file, by=0.3, short=FILE[60:100])
    s.add(req)
    assert run(s) == [[("k", 100)]] and req.prompt_token_ids == short_file
    # no short context asked (no deadline): the whole prompt, however long
    s2, _ = scheduler()
    whole = keystroke("w", FILE, by=None)
    s2.add(whole)
    assert run(s2)[0] == [("w", 512)] and whole.prompt_token_ids == FILE


def test_the_request_deadline_counts_when_it_is_earlier_and_a_later_budget_keeps_the_file():
    s, clock = scheduler()
    late = keystroke("a", FILE, by=10.0, deadline=1.0)  # 3.75 s > its deadline: short
    s.add(late)
    assert run(s)[0] == [("a", 300)]
    s2, _ = scheduler()
    roomy = keystroke("b", FILE, by=10.0)  # 3.75 s < 10 s: the whole file
    s2.add(roomy)
    assert run(s2)[0] == [("b", 512)] and roomy.prompt_token_ids == FILE


def test_the_next_keystroke_before_the_file_is_warm_is_short_again_and_the_warm_up_goes_on():
    s, clock = scheduler()
    s.add(keystroke("k1", FILE, by=0.3, deadline=3.0))
    batch = s.schedule()  # the short answer's step
    s.update(batch, [[7]])
    batch = s.schedule()  # one warm-up step: 512 of the file's tokens
    assert [(c.request.request_id, c.num_tokens) for c in batch.chunks] == [("k1/warm", 512)]
    s.update(batch, [])
    clock.t = 1.0
    k2 = keystroke("k2", FILE + [9], by=1.3, deadline=4.0)  # 989 tokens left: 2.5 s, still late
    s.add(k2)
    steps = run(s)
    # short again, and the short context is cached itself: 12 tokens to compute
    assert steps[0] == [("k2", 12)] and k2.prompt_token_ids == SHORT and k2.num_cached_tokens == 288
    # the warm-up starts where the first one stopped: the 512 tokens it computed are cached
    assert sum(n for step in steps[1:] for _, n in step) == 1488 - 512
