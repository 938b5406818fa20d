"""Prompt chunks paced to a short step (StepCost, SchedulerConfig.step_target_ms): while another
session is quick (typing on a warm prefix, or decoding), a long cold prompt runs in chunks this
machine computes in about step_target_ms, so a keystroke that arrives behind it is admitted at the
next step instead of waiting out 512-token steps; alone, or beside other cold sessions only, it
fills the budget."""

from warmpath.config import SchedulerConfig
from warmpath.engine.block_pool import BlockPool
from warmpath.engine.request import FinishReason, Request, RequestMetrics, SamplingParams
from warmpath.engine.scheduler import Scheduler
from warmpath.engine.step_cost import StepCost

ACTIVE_S = 5.0  # a session that asked this recently is still typing (engine/scheduler/_pacing.py)


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def request(rid: str, n: int, session: str) -> Request:
    # alice's prompts share a prefix; nobody else's does
    start = 0 if session == "alice" else 100_000
    return Request(rid, list(range(start, start + n)), SamplingParams(max_tokens=4, temperature=0),
                   frozenset(), 4, None, RequestMetrics(arrival_time=0.0), session)


def scheduler(step_target_ms: float = 100.0, measured: bool = False,
              config: SchedulerConfig | None = None, blocks: int = 512) -> tuple[Scheduler, Clock]:
    """A scheduler on a test clock; `measured`: after a 512-token step at 2.5 ms a token (no
    overhead)."""
    cost, clock = StepCost(), Clock()
    if measured:
        cost.record(512, 512 * 0.0025)
    config = config or SchedulerConfig(512, 64, step_target_ms)
    return Scheduler(config, BlockPool(blocks, 16, True, b"test"), cost, clock=clock), clock


def test_the_chunk_is_what_the_measured_steps_compute_in_the_target():
    cost = StepCost()
    s = Scheduler(SchedulerConfig(512, 64, 100.0), BlockPool(512, 16, True, b"test"), cost)
    assert s.latency_chunk is None
    # a decode step: 10 ms whatever it computes; what a token costs is not known yet
    cost.record(8, 0.010)
    assert s.latency_chunk is None
    # 2.5 ms a token: 90 ms beyond the overhead hold 36, 32 in blocks
    cost.record(512, 0.010 + 512 * 0.0025)
    assert s.latency_chunk == 32
    cost.record(64, 0.010 + 64 * 0.1)  # slower steps pull it down, never below a block
    assert s.latency_chunk == 16
    off, _ = scheduler(step_target_ms=0)
    assert off.latency_chunk is None


def typed(s: Scheduler, rid: str, n: int, session: str) -> None:
    """A request of session answered: it was admitted needing n tokens, and finished."""
    s.add(request(rid, n, session))
    s.schedule()
    s.finish(next(r for r in s.running_requests() if r.request_id == rid), FinishReason.STOP)


def test_a_keystroke_behind_a_cold_prompt_runs_in_the_next_short_step():
    s, clock = scheduler(measured=True)
    typed(s, "key0", 20, "bob")  # bob types on a warm prefix: 20 new tokens a keystroke
    s.add(request("cold", 1500, "alice"))
    clock.t = 0.5
    s.add(request("key", 20, "bob"))
    plan = s.schedule()
    chunks = {c.request.request_id: c.num_tokens for c in plan.chunks}
    # both in one short step; the cold prompt goes on after
    assert chunks == {"cold": 32, "key": 20}
    s.update(plan, [[1]])
    assert {c.request.request_id: c.num_tokens
            for c in s.schedule().chunks} == {"cold": 32, "key": 1}


def test_alone_a_prompt_fills_the_budget_and_paces_while_another_session_types():
    s, _ = scheduler(measured=True)
    s.add(request("cold", 1500, "alice"))
    assert [c.num_tokens for c in s.schedule().chunks] == [512]
    s2, clock2 = scheduler(measured=True)
    typed(s2, "key", 20, "bob")
    clock2.t = 1.0
    # bob asked a second ago: his next keystroke may come mid-step
    s2.add(request("cold", 1500, "alice"))
    assert [c.num_tokens for c in s2.schedule().chunks] == [32]
    clock2.t = 1.0 + ACTIVE_S + 0.1  # bob stopped typing
    assert [c.num_tokens for c in s2.schedule().chunks] == [512]


def test_cold_sessions_alone_are_not_held_back():
    """Two developers opening files at once: neither has a keystroke a long chunk would delay, and
    short chunks only add each step's fixed cost to both their waits."""
    s, clock = scheduler(measured=True)
    s.add(request("cold-a", 1500, "alice"))
    s.add(request("cold-b", 1500, "bob"))
    plan = s.schedule()
    assert [c.num_tokens for c in plan.chunks] == [512]  # the budget, first come first served
    s.update(plan, [])
    plan = s.schedule()
    # a chunk of it left to the one waiting: admitted
    assert [c.num_tokens for c in plan.chunks] == [480, 32]
    s.update(plan, [])
    # someone types on a warm prefix: admitted beside them, then both are paced
    typed(s, "key", 20, "carol")
    assert sorted(c.num_tokens for c in s.schedule().chunks) == [32, 32]


def test_a_session_that_goes_cold_stops_pacing_the_others():
    s, clock = scheduler(measured=True)
    typed(s, "key", 20, "bob")
    s.add(request("cold", 1500, "alice"))
    assert [c.num_tokens for c in s.schedule().chunks] == [32]
    # bob opened another file: his requests are slow whatever we do
    s.add(request("other-file", 1200, "bob"))
    s.update(s.schedule(), [])
    plan = s.schedule()
    # first come, first served
    assert {c.request.request_id: c.num_tokens for c in plan.chunks} == {"cold": 512}


def test_a_stream_being_decoded_paces_a_cold_prompt():
    s, clock = scheduler(measured=True)
    s.add(request("chat", 600, "bob"))
    while not s.running_requests() or not s.running_requests()[0].output_token_ids:
        plan = s.schedule()
        s.update(plan, [[1] for c in plan.chunks if c.sample])
    s.add(request("cold", 1500, "alice"))
    chunks = {c.request.request_id: c.num_tokens for c in s.schedule().chunks}
    # bob's next token comes after a short step, not a 512-token one
    assert chunks == {"chat": 1, "cold": 32}


def test_a_late_prompt_computes_on_for_its_session_and_yields_to_everyone():
    """Past its deadline mid-prompt, a session's request leaves a warm-up: its prompt's full blocks
    computed with the budget the others leave, reported to nobody; the session's next request ends
    it and finds them cached."""
    s, clock = scheduler(measured=True)
    late = request("late", 1500, "alice")
    late.deadline = 0.3
    s.add(late)
    s.update(s.schedule(), [])  # alone: a full 512-token chunk
    clock.t = 0.4
    plan = s.schedule()
    assert late in plan.finished and late.finish_reason.value == "deadline"
    warm = [c.request for c in plan.chunks]
    # its computed blocks, reused
    assert len(warm) == 1 and warm[0].warmup and warm[0].num_cached_tokens == 512
    assert plan.chunks[0].num_tokens == s.latency_chunk == 32  # alone, still one short step's chunk
    # a warm-up is not a request in the statistics
    assert s.stats.prefix_cache_queried_tokens == 1500
    s.update(plan, [])
    s.add(request("key", 20, "bob"))  # someone else's keystroke comes first, whole
    plan = s.schedule()
    # the warm-up sits out
    assert [(c.request.request_id, c.num_tokens) for c in plan.chunks] == [("key", 20)]
    s.update(plan, [[1] for c in plan.chunks if c.sample])
    for _ in range(200):
        plan = s.schedule()
        if not plan.chunks:
            break
        s.update(plan, [[1] for c in plan.chunks if c.sample])
    # done at its last full block
    assert not any(r.warmup for r in s.running_requests()) and not s.queued_warm_ups()
    nxt = request("next", 1510, "alice")
    s.add(nxt)
    plan = s.schedule()
    assert nxt.num_cached_tokens == 1488  # every full block of the late prompt (1500 // 16 * 16)


def warming(s: Scheduler, clock: Clock, n: int) -> Request:
    """alice's n-token prompt, late after one step: the warm-up it leaves, after its first step."""
    late = request("late", n, "alice")
    late.deadline = 0.3
    s.add(late)
    s.update(s.schedule(), [])
    clock.t = 0.4
    s.update(s.schedule(), [])
    return next(r for r in s.running_requests() if r.warmup)


def test_the_sessions_next_request_ends_its_warm_up():
    s, clock = scheduler()
    warm = warming(s, clock, 1500)
    s.add(request("typed", 1502, "alice"))
    assert warm.finished and warm not in s.running_requests() and not s.queued_warm_ups()
    # no deadline passed: a plain abort leaves nothing behind
    stale = request("stale", 700, "carol")
    s.add(stale)
    s.finish(stale, FinishReason.ABORT)
    assert not s.queued_warm_ups()


def test_a_warm_up_gives_its_blocks_back_before_anyone_waits_for_them():
    s, clock = scheduler(config=SchedulerConfig(256, 64, 100.0), blocks=40)  # 640 tokens of KV
    warm = warming(s, clock, 600)
    assert len(warm.block_ids) == 32 and 40 - sum(len(r.block_ids)
                                                  for r in s.running_requests()) < 32
    s.add(request("bob", 500, "bob"))  # needs more blocks than are free: the warm-up goes, bob runs
    plan = s.schedule()
    assert warm.finished and [c.request.request_id
                              for c in plan.chunks] == ["bob"] and not s.stats.num_preemptions


def test_a_prompt_its_client_left_computes_on_for_the_next_keystroke_unless_that_one_is_in():
    """Stale or dropped by the editor's own first-token deadline (which the server never sees), a
    session's request closed mid-prompt leaves a warm-up: the next keystroke's prompt shares all of
    it but its end. Not when the session's next request is in already, nor for a request past its
    prompt, nor without a session."""
    s, clock = scheduler()
    left = request("left", 1500, "alice")
    s.add(left)
    s.update(s.schedule(), [])  # one 512-token chunk
    s.abort(left)
    assert left.finish_reason == FinishReason.ABORT
    assert [w.prompt_token_ids for w in s.queued_warm_ups()] == [left.prompt_token_ids[:1488]]
    s.add(nxt := request("next", 1502, "alice"))  # the next keystroke ends the warm-up
    assert not s.queued_warm_ups()
    s.abort(nxt)  # closed before admission: warms again
    assert len(s.queued_warm_ups()) == 1
    s.add(newer := request("newer", 1504, "alice"))
    s.add(newest := request("newest", 1506, "alice"))
    s.abort(newer)  # the newest is in: it computes the prompt itself
    assert not s.queued_warm_ups() and newest in s.waiting_requests()
    s.finish(newest, FinishReason.ABORT)
    s.add(bob := request("bob", 40, "bob"))
    plan = s.schedule()
    s.update(plan, [[1] for c in plan.chunks if c.sample])
    assert bob.output_token_ids
    s.abort(bob)  # past its prompt: nothing to warm
    anonymous = Request("anon", list(range(9000, 9600)), SamplingParams(max_tokens=4), frozenset(),
                        4, None, RequestMetrics(arrival_time=0.0))
    s.add(anonymous)
    s.abort(anonymous)  # no session: nobody's next keystroke
    assert not s.queued_warm_ups()


def test_of_several_warm_ups_the_one_with_the_fewest_tokens_left_computes_first():
    """Two developers' cold files warm at once: the shorter one gets the idle steps until it is done
    (shortest remaining first), so its developer is answered seconds sooner and the other no later
    than both would be."""
    s, clock = scheduler(measured=True)
    for rid, n, session in (("long", 1700, "alice"), ("short", 1000, "bob")):
        # alice's file came first
        r = request(rid, n, session)
        r.deadline = 0.3
        s.add(r)
    clock.t = 0.4
    plan = s.schedule()  # both late before a token: two warm-ups, bob's admitted first
    assert {r.request_id for r in plan.finished} == {"long", "short"}
    steps = []
    for _ in range(200):
        if not plan.chunks:
            break
        assert len(plan.chunks) == 1 and plan.chunks[0].num_tokens <= s.latency_chunk
        steps.append(plan.chunks[0].request.session_id)
        s.update(plan, [[1] for c in plan.chunks if c.sample])
        plan = s.schedule()
    # full blocks only: 992 and 1696 tokens
    assert steps == ["bob"] * (992 // 32) + ["alice"] * (1696 // 32)


def test_queued_warm_ups_keep_their_bounds_the_oldest_going_first():
    """Warm-ups wait for an idle step, so late requests from ever new sessions would queue without
    end: the queue holds at most warm_up_tokens_per_tenant tokens of one tenant (the request's,
    server/tenancy.py: its cache salts are all one tenant) and warm_up_tokens in all; past a bound
    the oldest go (the tenant's own for its bound), counted; one alone over a bound never queues."""
    s, _ = scheduler(config=SchedulerConfig(512, 64, 100.0, True, 1000, 1600))
    asked = [("a", "x", 480), ("b", None, 480), ("a", "y", 480), ("a", "z", 480), ("c", None, 480),
             ("b", None, 2000)]
    for i, (tenant, salt, n) in enumerate(asked):
        s.warm_up(f"r{i}", list(range(i * 10_000, i * 10_000 + n)), f"dev{i}", salt, tenant)
    queued = [w.session_id for w in s.queued_warm_ups()]
    assert queued == ["dev2", "dev3", "dev4"]  # dev0 (a's oldest), dev1 (oldest), dev5
    assert s.warm_up_tokens == 3 * 480 and sum(
        w.num_tokens for w in s.queued_warm_ups() if w.tenant == "a") == 960
    assert (s.stats.warm_ups_dropped_tenant, s.stats.warm_ups_dropped_total) == (2, 1)
    s.add(request("typed", 500, "dev3"))  # a session's next request still ends its warm-up
    assert [w.session_id
            for w in s.queued_warm_ups()] == ["dev2", "dev4"] and s.warm_up_tokens == 960


def test_a_step_of_warm_ups_alone_is_idle_for_the_heap_trimmer():
    """engine/heap.py trims when the engine works for no client: a node that always has some prompt
    warming (a flood of late requests) must still give its free heap back."""
    s, clock = scheduler()
    assert s.only_warm_ups()  # nothing at all
    warm = warming(s, clock, 1500)
    assert warm in s.running_requests() and s.only_warm_ups()
    s.add(request("typed", 40, "bob"))
    assert not s.only_warm_ups()
