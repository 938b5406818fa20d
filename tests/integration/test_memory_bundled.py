"""A native-only plan keeps only the kernel's weights (the ~96 MB of the GGUF's blocks), not a 513
MB fp32 model beside them: the process stays under half a gigabyte with a small KV pool."""

import subprocess
import sys

CODE = """
from warmpath import LLM
llm = LLM("smollm2", plan="native-int8", num_kv_blocks=64)
assert llm.engine.runner.model is None
print(int(open("/proc/self/statm").read().split()[1]) * 4096)
"""


def test_resident_memory_of_a_native_plan_with_64_kv_blocks():
    rss = int(
        subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                       check=True).stdout)
    assert rss < 500e6, f"{rss / 1e6:.0f} MB resident"


BUDGET = "1GiB"


def _blocks(**kw) -> tuple[int, int]:
    from warmpath import LLM

    engine = LLM("smollm2", memory_budget=BUDGET, **kw).engine
    return engine.pool.num_blocks, engine.weight_bytes


def test_one_memory_budget_the_engine_and_the_simulator_count_alike():
    """Weights, working buffers and KV share the budget; the simulator's profile
    (models/footprint.py) gives the engine's block count exactly for each weights form, so a dtype
    sweep is a real capacity answer."""
    from warmpath.models.footprint import parse_bytes
    from warmpath.sim.profiles import get_profile

    profile = get_profile("cpu-smollm2")
    for form, plan in (("float32", "torch-fp32"), ("bfloat16", "torch-bf16"), ("int8",
                                                                               "native-int8")):
        blocks, weights = _blocks(plan=plan)
        assert weights == profile.weight_bytes[form], form
        assert blocks == profile.num_kv_blocks(form, parse_bytes(BUDGET)), form


def test_the_native_plan_holds_twice_the_kv_blocks_of_the_fp32_named_native_path_in_one_budget():
    """Named by dtype, the int8 kernel is the same plan with the dtype's fp32 cache: the same
    weights (no torch model beside the kernel: it would compute nothing), half the KV blocks of the
    plan's 16-bit cache."""
    planned, planned_weights = _blocks(plan="native-int8")
    named, named_weights = _blocks(dtype="float32", kernel="native", kernel_activations="int8")
    assert planned_weights == named_weights
    assert planned >= 2 * named, (planned, named)
