"""StepCost: one model of what a step costs (overhead + tokens x per token), learned from the steps
run, read by the scheduler's pacing, the admission estimate and the simulator; MovingAverage, the
one smoothing rule."""

import pytest

from warmpath.engine.step_cost import BIG_STEP, StepCost
from warmpath.stats import MovingAverage


def test_big_steps_teach_the_per_token_cost_and_small_ones_the_overhead():
    cost = StepCost()
    assert cost.per_token is None and cost.overhead == 0.0 and cost.seconds(1000, 2) == 0.0
    cost.record(1, 0.020)  # a decode: 20 ms whatever it computes
    assert cost.overhead == pytest.approx(0.020) and cost.per_token is None
    cost.record(512, 0.020 + 512 * 0.002)  # a prompt chunk: its overhead taken off, 2 ms a token
    assert cost.per_token == pytest.approx(0.002)
    assert cost.seconds(1000, 2) == pytest.approx(1000 * 0.002 + 2 * 0.020)
    assert cost.seconds(0, 3) == 0.0  # nothing to compute costs nothing
    cost.record(0, 5.0)  # an empty step teaches nothing
    assert cost.overhead == pytest.approx(0.020)


def test_a_step_of_a_given_time_holds_whole_blocks_one_at_least():
    cost = StepCost()
    assert cost.tokens_within(0.1, 16) is None
    cost.record(BIG_STEP, BIG_STEP * 0.0025)
    assert cost.tokens_within(0.1, 16) == 32  # 40 tokens, 32 in whole blocks
    cost.record(8, 0.090)  # a 90 ms overhead leaves 10 ms: 4 tokens, still one block
    assert cost.tokens_within(0.1, 16) == 16


def test_the_start_up_figure_seeds_the_cost_and_stays_as_measured():
    cost = StepCost.measured(0.003, 64)
    assert cost.prompt_seconds_per_token == 0.003 and cost.per_token == pytest.approx(0.003)
    cost.record(512, 512 * 0.006)
    # the FIM suffix budget's: fixed
    assert cost.per_token > 0.003 and cost.prompt_seconds_per_token == 0.003


def test_the_moving_average_weighs_each_new_measurement_by_a_fifth():
    avg = MovingAverage()
    assert avg.value is None
    assert avg.add(10.0) == 10.0  # the first is taken whole
    assert avg.add(20.0) == pytest.approx(12.0)
    assert MovingAverage(weight=0.5, value=1.0).add(3.0) == 2.0
