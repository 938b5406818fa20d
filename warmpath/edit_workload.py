"""The edit workload: a developer asks for a real function rewritten with one small change (rename a
variable, add a parameter, add a docstring), so the answer mostly copies the prompt: what "explain /
rewrite this code" and agent edit turns look like, and speculative decoding's best case. Functions
come from the Python standard library on this machine (the same files as the editor workload);
deterministic for a seed."""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass

from warmpath.workloads import _read, _relative, stdlib_files


@dataclass(frozen=True)
class EditTask:
    path: str  # the file, relative to the standard library
    function: str
    code: str  # the function's source as it is in the file
    change: str  # the instruction, in words

    def messages(self) -> list[dict]:
        return [{
            "role": "user",
            "content": f"Rewrite this Python function with one change: {self.change}. Reply "
            f"with the whole rewritten function only.\n\n```python\n{self.code}\n```"
        }]


def _change(rng: random.Random, fn: ast.FunctionDef) -> str | None:
    names = sorted({
        n.id
        for n in ast.walk(fn)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and len(n.id) > 2
    })
    choices = ["add a one-line docstring"] if ast.get_docstring(fn) is None else []
    if names:
        old = rng.choice(names)
        choices.append(f"rename the variable `{old}` to `{old}_value`")
    choices.append(f"add a keyword parameter `verbose=False` to `{fn.name}` (unused)")
    return rng.choice(choices)


def edit_tasks(n: int, seed: int = 0, min_lines: int = 8, max_lines: int = 30) -> list[EditTask]:
    """n functions of min_lines..max_lines lines, each with a change to make."""
    rng = random.Random(seed)
    files = list(stdlib_files())
    tasks: list[EditTask] = []
    seen: set[tuple[str, str]] = set()
    while len(tasks) < n:
        path = rng.choice(files)
        text = _read(path)
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        fns = [
            f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and
            f.end_lineno is not None and min_lines <= f.end_lineno - f.lineno + 1 <= max_lines
        ]
        if not fns:
            continue
        fn = rng.choice(fns)
        key = (_relative(path), fn.name)
        if key in seen:
            continue
        seen.add(key)
        code = ast.get_source_segment(text, fn, padded=True)
        if code is None:
            continue
        lines = code.splitlines()
        indent = min(len(x) - len(x.lstrip()) for x in lines if x.strip())
        code = "\n".join(x[indent:] for x in lines)
        tasks.append(EditTask(key[0], fn.name, code, _change(rng, fn)))
    return tasks
