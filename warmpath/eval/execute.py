"""Running a completed program against its tests: in eval's sandbox (eval/sandbox.py), a bare
interpreter shut off from the network and the user's files where the system allows it, with time,
CPU, memory, process, file and output bounds; it passes when it exits 0 within them."""

from __future__ import annotations

from warmpath.eval.sandbox import Limits, run_python


def passes(program: str, timeout_s: float = 10.0) -> bool:
    return run_python(program, Limits(timeout_s=timeout_s)).passed
