"""Running a completed program against its tests: a fresh isolated interpreter in an empty directory, with a time
and memory bound; it passes when it exits 0."""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile

MEMORY_BYTES = 2 << 30


def _limits() -> None:  # in the child, before exec
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def passes(program: str, timeout_s: float = 10.0) -> bool:
    with tempfile.TemporaryDirectory(prefix="warmpath-eval-") as cwd:
        try:
            done = subprocess.run([sys.executable, "-I", "-c", program], cwd=cwd, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL, capture_output=True, preexec_fn=_limits)
        except subprocess.TimeoutExpired:
            return False
    return done.returncode == 0
