"""The one outcome rule: what the developer (or the agent) got from a request, from when its first
token came, when the client closed it, and how it ended. `stream_completion` (real HTTP) and the
simulator's records both call it; TTFT as the reports count it (censored) is defined here too."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol

SHOWN = "shown"  # editor: the first token arrived within the deadline and before a newer keystroke
# no first token within the deadline (also: server silence), or an agent's answer cut short
DROPPED = "dropped"
# editor: a newer keystroke made it stale before it was shown; the stream was closed
CANCELLED = "cancelled"
COMPLETED = "completed"  # agent (no client deadline): the server finished the answer
ERROR = "error"  # an HTTP or protocol error: never acceptable
OUTCOMES = (SHOWN, DROPPED, CANCELLED, COMPLETED, ERROR)

FINISHED = ("stop", "length")  # finish reasons of an answer the server ended itself
# finish reason of a suggestion whose node died mid-stream (a router says so)
CUT = "upstream_failed"


def outcome(kind: str, first_token: float | None, *, cancelled_at: float | None = None,
            deadline: float | None = None, finish_reason: str | None = None,
            error: str | None = None) -> str:
    """`kind` editor | agent; times on one clock: the first token, the client's cancel (a newer
    keystroke or the end of a run), the client's first-token deadline. A first token later than the
    cancel or the deadline was never seen (the stream was closed first): the simulator knows when it
    would have come, a real client does not, and both get the same answer."""
    if error is not None:
        # A suggestion cut short is discarded: the developer sees nothing, as for a late one.
        return DROPPED if kind == "editor" and finish_reason == CUT else ERROR
    if cancelled_at is not None and (first_token is None or first_token > cancelled_at):
        return CANCELLED
    if first_token is None or (deadline is not None and first_token > deadline):
        return DROPPED
    if kind == "editor":
        # once shown, a suggestion stays shown whatever happens to the rest of its stream
        return SHOWN
    return COMPLETED if finish_reason in FINISHED else DROPPED


class Timed(Protocol):
    outcome: str

    @property
    def ttft(self) -> float | None: ...


def censored_ttft(outcome: str, ttft: float | None) -> float | None:
    """TTFT as percentiles and goodput count it: the time to a first token the client saw; +inf for
    a request dropped or failed before one (only known to be later than the deadline: never the
    deadline itself); None (left out) for one cancelled stale before it, which nobody wanted any
    more."""
    if ttft is not None:
        return ttft
    return math.inf if outcome in (DROPPED, ERROR) else None


def censored_ttfts(records: Iterable[Timed]) -> list[float]:
    return [v for r in records if (v := censored_ttft(r.outcome, r.ttft)) is not None]


def goodput(records: Iterable[Timed], target_s: float) -> float | None:
    """The share of requests (cancelled ones left out) whose first token the client saw within
    target_s."""
    vals = censored_ttfts(records)
    return sum(v <= target_s for v in vals) / len(vals) if vals else None
