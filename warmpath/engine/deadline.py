"""The deadline: one rule, applied by the engine at three moments. A request is late past its
`deadline`, and, before its first token, past its `prompt_deadline` too (llama.cpp's
t_max_prompt_ms); both are time.monotonic() values the protocols translate their own fields into
(X-Deadline-Ms, t_max_prompt_ms, ...). The moments:
- at submit (AsyncEngine.submit): refused unrun when the work queued ahead cannot let it start in
  time (`refusal`);
- between step boundaries (RequestStream): its stream ends when it is late even mid-step
  (`expires_at`);
- in each step (the scheduler): a late request finishes with DEADLINE, its prompt left warming
  (`is_late`).
"""

from __future__ import annotations

from typing import Protocol

from warmpath.engine.request import FinishReason


class Deadlines(Protocol):
    deadline: float | None
    prompt_deadline: float | None


def expires_at(request: Deadlines, generated: bool) -> float | None:
    """When the request is late: its deadline, and before its first token the prompt phase's."""
    candidates = (request.deadline, None if generated else request.prompt_deadline)
    return min((d for d in candidates if d is not None), default=None)


def is_late(request: Deadlines, now: float, generated: bool) -> bool:
    end = expires_at(request, generated)
    return end is not None and now >= end


def refusal(request: Deadlines, now: float, wait: float) -> FinishReason | None:
    """Why a request is refused unrun at submit: DEADLINE already past, OVERLOADED when the `wait`
    for the work queued ahead of it ends past its deadline; None: it is taken in."""
    if request.deadline is None or now + wait <= request.deadline:
        return None
    return FinishReason.DEADLINE if now >= request.deadline else FinishReason.OVERLOADED
