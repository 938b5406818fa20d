"""Prompt chunks paced to a short step (Scheduler.observe, SchedulerConfig.step_target_ms): while another session
is typing, a long cold prompt runs in chunks this machine computes in about step_target_ms, so a keystroke that
arrives behind it is admitted at the next step instead of waiting out 512-token steps; alone, it fills the budget."""

from warmpath.config import SchedulerConfig
from warmpath.engine.block_pool import BlockPool
from warmpath.engine.request import FinishReason, Request, RequestMetrics, SamplingParams
from warmpath.engine.scheduler import ACTIVE_S, Scheduler


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def request(rid: str, n: int, session: str) -> Request:
    start = 0 if session == "alice" else 100_000  # alice's prompts share a prefix; nobody else's does
    return Request(rid, list(range(start, start + n)), SamplingParams(max_tokens=4, temperature=0), frozenset(), 4,
                   None, RequestMetrics(arrival_time=0.0), session)


def scheduler(step_target_ms: float = 100.0) -> tuple[Scheduler, Clock]:
    s = Scheduler(SchedulerConfig(512, 64, step_target_ms), BlockPool(512, 16, True, b"test"))
    s.clock = clock = Clock()
    return s, clock


def test_the_chunk_is_what_the_measured_steps_compute_in_the_target():
    s, _ = scheduler()
    assert s.latency_chunk is None
    s.observe(8, 10.0)  # too few tokens to say what a token costs
    assert s.latency_chunk is None
    s.observe(512, 512 * 0.0025)  # 2.5 ms a token: 100 ms hold 40 tokens, 32 in whole blocks
    assert s.latency_chunk == 32
    s.observe(64, 64 * 0.1)  # slower steps pull it down, never below a block
    assert s.latency_chunk == 16
    off, _ = scheduler(step_target_ms=0)
    off.observe(512, 1.0)
    assert off.latency_chunk is None


def test_a_keystroke_behind_a_cold_prompt_runs_in_the_next_short_step():
    s, clock = scheduler()
    s.observe(512, 512 * 0.0025)
    s.add(request("cold", 1500, "alice"))
    clock.t = 0.5
    s.add(request("key", 20, "bob"))
    plan = s.schedule()
    chunks = {c.request.request_id: c.num_tokens for c in plan.chunks}
    assert chunks == {"cold": 32, "key": 20}  # both in one short step; the cold prompt goes on after
    s.update(plan, [[1]])
    assert {c.request.request_id: c.num_tokens for c in s.schedule().chunks} == {"cold": 32, "key": 1}


def test_alone_a_prompt_fills_the_budget_and_paces_while_another_session_types():
    s, _ = scheduler()
    s.observe(512, 512 * 0.0025)
    s.add(request("cold", 1500, "alice"))
    assert [c.num_tokens for c in s.schedule().chunks] == [512]
    s2, clock2 = scheduler()
    s2.observe(512, 512 * 0.0025)
    s2.add(request("key", 20, "bob"))
    s2.finish(s2.waiting[0], FinishReason.STOP)  # answered
    clock2.t = 1.0
    s2.add(request("cold", 1500, "alice"))  # bob asked a second ago: his next keystroke may come mid-step
    assert [c.num_tokens for c in s2.schedule().chunks] == [32]
    clock2.t = 1.0 + ACTIVE_S + 0.1  # bob stopped typing
    assert [c.num_tokens for c in s2.schedule().chunks] == [512]


def test_a_late_prompt_computes_on_for_its_session_and_yields_to_everyone():
    """Past its deadline mid-prompt, a session's request leaves a warm-up: its prompt's full blocks computed with
    the budget the others leave, reported to nobody; the session's next request ends it and finds them cached."""
    s, clock = scheduler()
    s.observe(512, 512 * 0.0025)
    late = request("late", 1500, "alice")
    late.deadline = 0.3
    s.add(late)
    s.update(s.schedule(), [])  # alone: a full 512-token chunk
    clock.t = 0.4
    plan = s.schedule()
    assert late in plan.finished and late.finish_reason.value == "deadline"
    warm = [c.request for c in plan.chunks]
    assert len(warm) == 1 and warm[0].warmup and warm[0].num_cached_tokens == 512  # its computed blocks, reused
    assert s.stats.prefix_cache_queried_tokens == 1500  # a warm-up is not a request in the statistics
    s.update(plan, [])
    s.add(request("key", 20, "bob"))  # someone else's keystroke comes first, whole
    plan = s.schedule()
    assert [(c.request.request_id, c.num_tokens) for c in plan.chunks][0] == ("key", 20)
    s.update(plan, [[1]])
    for _ in range(200):
        plan = s.schedule()
        if not plan.chunks:
            break
        s.update(plan, [[1] for c in plan.chunks if c.sample])
    assert not any(r.warmup for r in s.running) and not s.warming  # done at its last full block
    nxt = request("next", 1510, "alice")
    s.add(nxt)
    plan = s.schedule()
    assert nxt.num_cached_tokens == 1488  # every full block of the late prompt (1500 // 16 * 16)


def test_the_sessions_next_request_ends_its_warm_up():
    s, clock = scheduler()
    late = request("late", 1500, "alice")
    late.deadline = 0.3
    s.add(late)
    s.update(s.schedule(), [])
    clock.t = 0.4
    s.update(s.schedule(), [])
    warm = next(r for r in s.running if r.warmup)
    s.add(request("typed", 1502, "alice"))
    assert warm.finished and warm not in s.running and not s.warming
    stale = request("stale", 700, "carol")  # no deadline passed: a plain abort leaves nothing behind
    s.add(stale)
    s.finish(stale, FinishReason.ABORT)
    assert not s.warming


def test_a_warm_up_gives_its_blocks_back_before_anyone_waits_for_them():
    s = Scheduler(SchedulerConfig(256, 64, 100.0), BlockPool(40, 16, True, b"test"))  # 640 tokens of KV
    s.clock = clock = Clock()
    late = request("late", 600, "alice")
    late.deadline = 0.3
    s.add(late)
    s.update(s.schedule(), [])
    clock.t = 0.4
    s.update(s.schedule(), [])
    warm = next(r for r in s.running if r.warmup)
    assert len(warm.block_ids) == 32 and s.pool.num_free < 32
    s.add(request("bob", 500, "bob"))  # needs more blocks than are free: the warm-up goes, bob runs
    plan = s.schedule()
    assert warm.finished and [c.request.request_id for c in plan.chunks] == ["bob"] and not s.stats.num_preemptions
