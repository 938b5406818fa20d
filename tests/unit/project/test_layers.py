"""The layer rules a user of the light parts relies on: the router, the clients, bench and the
simulator start without torch (seconds, not a 1 GB import), and no source file outgrows one
screenful of jobs."""

import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "warmpath"


@pytest.mark.parametrize("module", [
    "warmpath.sim", "warmpath.router", "warmpath.client", "warmpath.bench", "warmpath.api",
    "warmpath.workloads", "warmpath.config"
])
def test_importing_leaves_torch_out(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False", f"import {module} loads torch"


def test_the_package_itself_imports_torch_only_when_the_engine_is_used():
    code = ("import sys, warmpath; a = 'torch' in sys.modules; warmpath.LLM; "
            "print(a, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["False", "True"]


def test_no_source_file_over_400_lines():
    sources = [p for ext in ("*.py", "*.c", "*.h") for p in PACKAGE.rglob(ext)]
    too_long = {
        str(p.relative_to(PACKAGE)): n
        for p in sources if (n := len(p.read_text().splitlines())) > 400
    }
    assert sources and not too_long
