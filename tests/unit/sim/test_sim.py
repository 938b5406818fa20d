"""The simulator drives the engine's own Scheduler and BlockPool (and the router's policies): a
change of eviction order in the engine changes its result; on the same agent trace the real engine
(tiny model) and the simulator give every common turn the same prefix hit; the cost fit; fleets; the
CLI; fleet mode (router replicas on the router's own load function, node loss, the fewest-nodes
search)."""

import json

import pytest

import warmpath.engine.block_pool as kv_cache
import warmpath.engine.scheduler as scheduler
import warmpath.router.proxy as proxy
import warmpath.router.scorer as scorer
import warmpath.sim.fleet as fleet_mod
from warmpath.cli import main
from warmpath.config import EngineConfig, SchedulerConfig
from warmpath.engine.engine import Engine
from warmpath.sim import chunk_tokenizer, simulate
from warmpath.sim.backends import RealBackend, SimBackend
from warmpath.sim.calibrate import fit
from warmpath.sim.capacity import fewest_nodes
from warmpath.sim.cost import CostModel, StepShape
from warmpath.sim.driver import Driver
from warmpath.sim.fleet import FAILOVERS, FleetDriver, FleetSpec
from warmpath.sim.fleet_command import simulate_fleet
from warmpath.sim.profiles import get_profile
from warmpath.workloads import AgentParams, agent_trace, make_trace

COST = CostModel(base=0.03, per_token=0.002, prefill_attention=2e-8, per_seq=5e-4, kv_read=1e-6,
                 per_chunk=0.04)


@pytest.fixture(scope="module")
def editor():
    return make_trace("editor", 6, 1800, seed=3, rate=4)


def run(trace, blocks, nodes=1, policy="hybrid"):
    return simulate(trace, get_profile("h100-llama3-8b"), chunk_tokenizer, "bfloat16", blocks, 512,
                    nodes, policy)


def test_the_simulator_runs_the_engines_own_scheduler_and_block_pool(editor):
    summary, driver = run(editor, 400)
    assert all(type(b.scheduler) is scheduler.Scheduler and type(b.pool) is kv_cache.BlockPool
               for b in driver.backends)
    assert summary["requests"] > 50 and 0.3 < summary["prefix_hit_rate"] < 1.0
    again, _ = run(editor, 400)
    assert again == {**summary, "wall_s": again["wall_s"]}  # deterministic


def test_a_change_of_eviction_order_in_the_engine_changes_the_simulation(editor, monkeypatch):
    """A tight pool evicts; the engine frees blocks to the back of its LRU queue. Put them at the
    front (most recently used evicted first) in the *engine's* BlockPool and the simulated hit rate
    moves."""
    lru, _ = run(editor, 160)
    assert lru["evictions"] > 0

    def free_to_the_front(self, blocks):
        for b in reversed(blocks):
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_queue[b] = None
                self.free_queue.move_to_end(b, last=False)
    monkeypatch.setattr(kv_cache.BlockPool, "free", free_to_the_front)
    mru, _ = run(editor, 160)
    assert mru["prefix_hit_rate"] != lru["prefix_hit_rate"]
    # a developer's own warm prefix goes first
    assert mru["prefix_hit_rate"] < lru["prefix_hit_rate"]


def test_a_smaller_pool_preempts_sooner_and_holds_fewer_sessions(editor):
    small, _ = run(editor, 100)
    big, _ = run(editor, 4000)
    assert big["preemptions"] == 0 and big["max_resident_sessions"] == 6
    assert small["max_resident_sessions"] < big["max_resident_sessions"]
    assert small["prefix_hit_rate"] < big["prefix_hit_rate"]


def test_fleets_use_the_routers_policies(editor):
    # each node holds about its share of the sessions' prefixes, not everybody's
    affine, driver = run(editor, 250, nodes=3, policy="session")
    spread, _ = run(editor, 250, nodes=3, policy="round-robin")
    assert type(driver.router).__module__ == "warmpath.router.policies"
    # misses are what cost
    assert 1 - affine["prefix_hit_rate"] < (1 - spread["prefix_hit_rate"]) / 2
    assert {r.node for r in driver.records.values()} == {0, 1, 2}
    by_session = {}
    for r in driver.records.values():
        by_session.setdefault(r.session, set()).add(r.node)
    # sessions stay put (bounded loads aside)
    assert sum(len(v) == 1 for v in by_session.values()) >= 4


def test_the_cost_fit_recovers_known_coefficients():
    shapes = [StepShape(n, n * (c + n / 2), 1, c + n, 1) for n in (16, 128, 512) for c in (0, 2048)]
    shapes += [StepShape(b, 0, b, b * (ctx + 1)) for b in (1, 4, 16) for ctx in (256, 2048)]
    fitted = fit([(s, COST.step_seconds(s)) for s in shapes])
    for a, b in zip(fitted.coefficients(), COST.coefficients(), strict=True):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-12)


def test_memory_budget_sets_the_pool():
    p = get_profile("h100-llama3-8b")
    assert p.num_kv_blocks("int8") > p.num_kv_blocks("bfloat16") > 0
    per_block = 131072 * 16
    assert p.num_kv_blocks("bfloat16") == (p.memory_bytes - p.weight_bytes["bfloat16"]) // per_block


def test_real_engine_and_simulator_give_every_common_turn_the_same_prefix_hit(tiny_long_dir):
    """Agent turns (closed loop, nothing cancelled) on an ample pool: whatever the step times, the
    prefix hit of each turn depends only on the scheduler and the block pool, which are the same
    code in both."""
    params = AgentParams(start_tokens=300, max_context_tokens=900, tool_tokens=(40, 120),
                         think_s=(0.05, 0.2), task_gap_s=2.0, max_tokens=8)
    trace = agent_trace(3, 6.0, seed=1, rate=1.0, params=params,
                        count_tokens=lambda s: len(s.encode()) // 4)
    engine = Engine(EngineConfig(model=str(tiny_long_dir), dtype="float32", num_kv_blocks=1024,
                                 scheduler=SchedulerConfig(max_num_batched_tokens=128)))
    vocab = engine.model_config.vocab_size

    def tokenize(text):
        return [b % (vocab - 10) + 5 for b in text.encode()][::4]  # prefix-preserving, in range
    real = Driver(trace, [RealBackend(engine, 0.0)], tokenize, realtime=True, drain_s=5.0)
    real.backends[0].origin = real._origin
    real.run()
    sim = Driver(trace, [SimBackend(COST, 1024, 16, 128)], tokenize)
    sim.run()

    def hits(d):
        return {(r.session, r.turn_index): r.cached_tokens
                for r in d.records.values() if r.cached_tokens is not None}
    a, b = hits(real), hits(sim)
    common = set(a) & set(b)
    assert len(common) >= 6 and any(a[k] > 0 for k in common)
    assert {k: a[k] for k in common} == {k: b[k] for k in common}


def test_simulate_cli_prints_a_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert main([
        "simulate", "--profile", "h100-llama3-8b", "--workload", "editor", "--sessions", "3",
        "--duration", "600", "--tokenizer", "chars", "--json",
        str(out), "--plot",
        str(tmp_path / "t.png")
    ]) == 0
    assert "prefix-cache hit rate" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["profile"] == "h100-llama3-8b" and len(report["runs"]) == 1
    assert (tmp_path / "t.png").stat().st_size > 1000
    assert main([
        "simulate", "--profile", "h100-llama3-8b", "--sweep", "pool", "--sessions", "3",
        "--duration", "300", "--tokenizer", "chars", "--plot",
        str(tmp_path / "s.png")
    ]) == 0
    assert (tmp_path / "s.png").stat().st_size > 1000


# -- fleets: router replicas, the router's own load function, node loss ----------------------------
def fleet(trace, nodes, spec, blocks=2000):
    p = get_profile("h100-llama3-8b")
    return simulate_fleet(trace, p, chunk_tokenizer, "bfloat16", blocks, 512, nodes, spec)


def test_fleets_weigh_loads_with_the_routers_own_node_load_and_avoid_a_queued_node():
    assert fleet_mod.node_load is scorer.node_load  # the function the real NodeSet.loads() calls
    trace = make_trace("editor", 4, 60, seed=1)
    driver = FleetDriver(trace, [SimBackend(COST, 500) for _ in range(3)], chunk_tokenizer,
                         spec=FleetSpec())
    session = next(f"dev-{i}" for i in range(100)
                   if driver.replicas[0].ring.home(f"dev-{i}") == "node0")
    queued = driver.backends[0]
    for j in range(6):
        # another replica's burst: the node's own gauges show it, this replica's counts do not
        queued.add(f"other-{j}", list(range(2, 200)), 16, f"other-{j}", None, 0.0)
    driver._handle(0.0, "scrape", {"session": "", "replica": 0})
    assert driver.scraped[0][0].waiting == 6 and driver.loads(0)["node0"] == 12
    assert driver._route("r1", session, "def f():\n" * 20) != 0
    for j in range(6):
        queued.abort(f"other-{j}", 0.5)
    driver._handle(1.0, "scrape", {"session": "", "replica": 0})
    # its queue gone, the session goes home
    assert driver._route("r2", session, "def f():\n" * 20) == 0


def test_replicas_agree_on_every_sessions_node_while_loads_are_under_the_floor():
    trace = make_trace("editor", 5, 600, seed=2, rate=4)
    summary, driver = fleet(trace, 8, FleetSpec(replicas=3, replica_by="request"))
    assert summary["replica_agreement"] == 1.0 and driver.agreement[1] == summary["requests"] > 50
    assert summary["decisions"] == {"affinity_kept": summary["requests"]}
    nodes = {}
    for r in driver.records.values():
        # round-robin over replicas, yet each session stays on one node
        nodes.setdefault(r.session, set()).add(r.node)
    assert all(len(v) == 1 for v in nodes.values())


def test_a_lost_node_moves_only_its_own_sessions_and_loses_no_request():
    trace = make_trace("editor", 16, 600, seed=4, rate=4)
    spec = FleetSpec(replicas=2)
    _, calm = fleet(trace, 4, spec)
    # the moment a request is still waiting for its first token: it must fail over, not fail
    victim = next(r for r in calm.records.values()
                  if r.first_token and r.first_token - r.sent > 0.01 and r.sent > 200)
    at = victim.sent + 0.001
    summary, driver = fleet(trace, 4, FleetSpec(replicas=2, kill_at=at, kill_node=victim.node))
    k = summary["node_loss"]
    assert k["node"] == f"node{victim.node}" and k["failed_over"] >= 1 and k["lost"] == 0
    assert k["other_sessions_moved"] == 0 and k["sessions_homed"] >= 1
    after = [r for r in driver.records.values() if r.sent >= at]
    assert after and all(r.node != victim.node for r in after)
    homes = driver.kill.homes
    assert all(r.node == homes[r.session] for r in after
               if homes.get(r.session, victim.node) != victim.node)
    moved = driver.records[victim.rid]
    assert moved.node != victim.node and moved.first_token is not None and moved.error is None
    assert not any(r.error and r.error != "upstream_failed" for r in driver.records.values())
    assert FAILOVERS == proxy.MAX_ATTEMPTS - 1


def test_a_small_fleet_run_is_deterministic_per_seed():
    def go(seed):
        s, _ = fleet(make_trace("editor", 24, 300, seed=seed, rate=4), 8,
                     FleetSpec(replicas=2, replica_by="request", kill_at=150.0))
        return {k: v for k, v in s.items() if k not in ("wall_s", "router_cpu")}
    a = go(5)
    assert a == go(5) and a != go(6)
    assert a["node_loss"]["at_s"] == 150.0 and 0 < a["prefix_hit_rate"] < 1


def test_fewest_nodes_bisects_to_the_smallest_fleet_that_meets_the_target():
    calls = []

    def run(n):
        calls.append(n)
        return {"editor_goodput": min(1.0, n / 10)}
    assert fewest_nodes(run, 0.9, 4)[0] == 9 and len(calls) <= 6
    assert fewest_nodes(lambda n: {"editor_goodput": 0.1}, 0.9, 4)[0] is None


def test_simulate_fleet_cli_answers_how_many_nodes(tmp_path, capsys):
    out = tmp_path / "fleet.json"
    assert main([
        "simulate", "--fleet", "--profile", "h100-llama3-8b", "--sessions", "6", "--duration",
        "300", "--rate", "4", "--tokenizer", "chars", "--nodes", "4", "--replicas", "2",
        "--kill-node-at", "150", "--sweep", "nodes", "--target-goodput", "0.9", "--json",
        str(out), "--plot",
        str(tmp_path / "f.png")
    ]) == 0
    text = capsys.readouterr().out
    assert "replica agreement" in text and "fewest nodes" in text
    report = json.loads(out.read_text())
    # one node would carry six developers, but not its own loss: every request after it fails (503)
    assert report["fewest_nodes"] == 2 and all(r["node_loss"] for r in report["runs"].values())
    assert (
        report["runs"]["1 nodes"]["editor_goodput"]
        < 0.9
        <= report["runs"]["2 nodes"]["editor_goodput"]
    )
    assert (tmp_path / "f.png").stat().st_size > 1000


# -- the real code models: profiles and the developer capacity sweep -------------------------------
@pytest.mark.parametrize("name", ["cpu-qwen2.5-coder-0.5b", "cpu-qwen2.5-coder-1.5b"])
def test_code_model_profiles_have_the_files_shape_and_a_fit(name):
    from warmpath.models.gguf_file import read_gguf
    from warmpath.models.gguf_meta import read_config
    from warmpath.models.registry import resolve_model

    p = get_profile(name)
    assert p.model_spec and p.cost["q4_k_m"].per_token > 0 and p.num_kv_blocks() > 1000
    try:
        path = resolve_model(p.model_spec)
    except FileNotFoundError:
        pytest.skip(f"{p.model_spec} not fetched")
    got = read_config(read_gguf(path))
    # the profile's shape is the file's: the KV bytes and the working buffers the simulator counts
    # follow from it
    assert p.model.kv_bytes_per_token("bfloat16") == got.kv_bytes_per_token("bfloat16")
    assert ((p.model.hidden_size, p.model.intermediate_size, p.model.num_layers, p.model.vocab_size)
            == (got.hidden_size, got.intermediate_size, got.num_layers, got.vocab_size))
    # the kernel reads the file's own blocks
    assert p.weight_bytes["q4_k_m"] <= 1.05 * path.stat().st_size


def test_holds_is_the_most_developers_inside_the_targets():
    from warmpath.sim.command import holds

    runs = {1: {"editor_goodput": 0.85, "editor_ttft_p50_s": 0.08}, 2: {"editor_goodput": 0.92,
            "editor_ttft_p50_s": 0.12}, 3: {"editor_goodput": 0.91, "editor_ttft_p50_s": 0.15},
            4: {"editor_goodput": 0.7, "editor_ttft_p50_s": 0.1}}
    assert holds(runs, 0.9, 0.3) == 3  # one developer's short trace missing by luck does not cap it
    assert holds(runs, 0.6, 0.3) == 4
    assert holds(runs, 0.9, 0.13) == 2  # the p50 target binds too
    assert holds({1: {"editor_goodput": None, "editor_ttft_p50_s": None}}, 0.9, 0.3) is None


def test_simulate_answers_how_many_developers_one_node_holds(tmp_path, capsys):
    out = tmp_path / "dev.json"
    assert main([
        "simulate", "--profile", "cpu-qwen2.5-coder-0.5b", "--sweep", "developers", "--duration",
        "60", "--rate", "30", "--tokenizer", "chars", "--json",
        str(out)
    ]) == 0
    assert "one node holds" in capsys.readouterr().out
    report = json.loads(out.read_text())
    runs = list(report["runs"].values())
    assert len(runs) == 8 and all(r["editor_goodput"] is not None for r in runs)
    # alone on the box is best
    assert runs[0]["editor_goodput"] == max(r["editor_goodput"] for r in runs) > 0
    held, target = report["holds_developers"], report["capacity_goodput"]
    # 95% of the best count's by default
    assert 0 < target <= max(r["editor_goodput"] for r in runs)
    assert held == 0 or runs[[1, 2, 3, 4, 6, 8, 12, 16].index(held)]["editor_goodput"] >= target
    # more developers on one 2-core box: goodput does not rise from the lightest load to the
    # heaviest
    assert runs[-1]["editor_goodput"] < runs[0]["editor_goodput"]


def test_a_paper_profile_cannot_be_calibrated(capsys):
    assert main(["simulate", "--profile", "h100-llama3-8b", "--calibrate"]) == 2
    assert "paper profile" in capsys.readouterr().err


def test_the_simulator_keeps_a_left_prompt_warming_as_the_engine_does():
    """The client gives up, late or stale: the engine keeps a session's unfinished prompt warming
    either way (Scheduler.abort) and tells late from stale by its clock; the simulated backend must
    too, or a cold prompt never warms in the simulation while it does on a server."""
    b = SimBackend(
        CostModel(base=0.01, per_token=0.004, prefill_attention=0.0, per_seq=0.0, kv_read=0.0), 512)
    b.add("late", list(range(1000)), 4, "alice", 0.3, 0.0)
    b.step(0.0)
    b.abort("late", 0.3)  # at the deadline: late
    assert [r.session_id for r in b.scheduler.queued_warm_ups()] == ["alice"]
    b.add("stale", list(range(5000, 6000)), 4, "bob", 0.8, 0.5)
    b.step(0.5)
    # before the deadline: stale, and its prompt warms on for bob's next keystroke
    b.abort("stale", 0.6)
    warm = [
        r.session_id for r in (*b.scheduler.queued_warm_ups(), *b.scheduler.running_requests())
        if r.warmup
    ]
    assert sorted(warm) == ["alice", "bob"]
    assert b.scheduler.stats.num_deadline_expired == 1 and b.scheduler.stats.num_aborted == 1


def test_the_simulated_kv_tier_brings_an_evicted_session_back_by_reading_at_the_disks_rate(editor):
    """The engine's scheduler restores from a tier exactly as it does over the disk tier
    (engine/kv_tier.py): with the tier the editor trace's sessions come back after their idle gaps,
    the reading costs step time at the profile's read rate, and a tier smaller than a block gives
    back nothing."""
    def with_tier(gib, profile="cpu-qwen2.5-coder-0.5b"):
        return simulate(editor, get_profile(profile), chunk_tokenizer,
                        get_profile(profile).default_dtype, 160, 512, tier_bytes=int(gib * 2**30))

    (none, _), (big, driver), (tiny, _) = with_tier(0), with_tier(8), with_tier(0.0001)
    assert none["evictions"] > 0 and none["tier_hit_rate"] == 0
    assert big["tier_hit_rate"] > 0.05 and big["prefix_hit_rate"] > none["prefix_hit_rate"] + 0.05
    assert big["editor_goodput"] > none["editor_goodput"]
    assert tiny["tier_hit_rate"] == 0
    # An H100 computes 16 tokens faster than a 200 MB/s disk reads their 2 MB of K/V: the tier is
    # left unread (but before the first step timed: the scheduler does not know yet).
    assert with_tier(8, "h100-llama3-8b")[0]["tier_hit_rate"] < 0.001
    tier = driver.backends[0].tier
    # every tier hit is a block read (warm-ups read some more, for their session's next keystroke)
    assert tier.restored_blocks * 16 >= big["tier_hit_rate"] * sum(
        b.scheduler.stats.prefix_cache_queried_tokens for b in driver.backends) > 0
    b = SimBackend(COST, 64, tier=type(tier)(1 << 30, 1000, 1e6))  # 1 ms a block
    b.add("a", list(range(800)), 1, "alice", None, 0.0)
    while b.busy():
        b.step(0.0)
    b.pool.reset_prefix_cache()
    b.add("b", list(range(800)) + [1, 2, 3], 1, "alice", None, 1.0)
    first = b.step(1.0)
    assert first.cached["b"] == 800 and b.scheduler.stats.prefix_cache_tier_hit_tokens == 800
    assert first.seconds >= 50 * 0.001  # 50 blocks read at 1 ms each, beside the step's compute


def test_simulate_answers_how_big_a_kv_tier(tmp_path, capsys):
    out = tmp_path / "tier.json"
    assert main([
        "simulate", "--profile", "cpu-qwen2.5-coder-0.5b", "--sweep", "kv-tier", "--developers",
        "6", "--duration", "600", "--rate", "10", "--num-kv-blocks", "300", "--tokenizer", "chars",
        "--json",
        str(out)
    ]) == 0
    assert "a KV tier of" in capsys.readouterr().out
    runs = json.loads(out.read_text())["runs"]
    assert runs["no tier"]["tier_hit_rate"] == 0 and runs["tier 8 GiB"]["tier_hit_rate"] > 0
    assert runs["tier 8 GiB"]["prefix_hit_rate"] > runs["no tier"]["prefix_hit_rate"]


def test_simulate_with_an_int8_kv_cache_holds_twice_the_blocks(capsys):
    """`--kv-cache-dtype int8`: the same memory budget, the engine's own accounting (a scale per
    row)."""
    blocks = {}
    for kv in ("bfloat16", "int8"):
        assert main([
            "simulate", "--profile", "h100-llama3-8b", "--sessions", "2", "--duration", "60",
            "--tokenizer", "chars", "--kv-cache-dtype", kv
        ]) == 0
        blocks[kv] = int(capsys.readouterr().err.split(" KV blocks")[0].rsplit(" ", 1)[-1])
    profile = get_profile("h100-llama3-8b")
    assert blocks["bfloat16"] == profile.num_kv_blocks()
    assert 1.9 < blocks["int8"] / blocks["bfloat16"] < 2


def test_an_editor_requests_suffix_is_computed_as_the_server_renders_it():
    """A FIM model's editor request is the server's FIM prompt (api/fim.py render): the suffix after
    the cursor is computed too, and it sits after the prefix, so keystrokes reuse less of the cache
    than a prefix-only prompt."""
    from warmpath.api import fim as api_fim
    from warmpath.api.fim import detect_fim
    from warmpath.config import ServerConfig

    trace = make_trace("editor", 2, 60, seed=1, rate=30)

    def run(fim, suffix_tokens=None) -> Driver:
        driver = Driver(trace, [SimBackend(COST, 4000)], chunk_tokenizer, fim=fim,
                        suffix_tokens=suffix_tokens)
        driver.run()
        return driver

    def mean_prompt(driver: Driver) -> float:
        editor = [r.prompt_tokens for r in driver.records.values() if r.kind == "editor"]
        assert editor
        return sum(editor) / len(editor)

    qwen = detect_fim(model="qwen2.5-coder-0.5b")
    plain, filled, kept = run(None), run(qwen), run(qwen, 64)
    suffix_tokens = len(chunk_tokenizer("x" * trace.editor_window[1]))
    assert suffix_tokens > 200 and mean_prompt(filled) - mean_prompt(plain) > 0.5 * suffix_tokens
    # The suffix's first lines only, as the server keeps them (--fim-suffix-tokens; the profile's
    # own budget)
    # + the cursor's line, a token per line
    assert 0 < mean_prompt(kept) - mean_prompt(plain) <= 64 + 1.5 * 16
    profile = get_profile("cpu-qwen2.5-coder-0.5b")
    assert profile.fim_suffix_tokens == api_fim.suffix_tokens(
        ServerConfig.fim_suffix_tokens,  # server's default
        profile.cost[profile.default_dtype].per_token)
    assert get_profile("cpu-qwen2.5-coder-0.5b").fim.name == "qwen2.5-coder"
    # no FIM family: prefix-only, as the server does
    assert get_profile("h100-llama3-8b").fim is None
