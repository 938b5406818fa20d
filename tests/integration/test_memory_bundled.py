"""A native-only plan keeps only the kernel's weights (the ~96 MB of the GGUF's blocks), not a 513 MB fp32 model
beside them: the process stays under half a gigabyte with a small KV pool."""

import subprocess
import sys

CODE = """
from warmpath import LLM
llm = LLM("smollm2", plan="native-int8", num_kv_blocks=64)
assert llm.engine.runner.model is None
print(int(open("/proc/self/statm").read().split()[1]) * 4096)
"""


def test_resident_memory_of_a_native_plan_with_64_kv_blocks():
    rss = int(subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True).stdout)
    assert rss < 500e6, f"{rss / 1e6:.0f} MB resident"
