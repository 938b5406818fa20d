"""Speculative decoding's proposers: cheap guesses of a request's next tokens, which the engine
verifies in the same step as everything else (engine.py `_verify`: the request's last token and its
k guesses computed as k+1 decode rows, each guess kept while it equals what the model samples there,
so the output is the model's own).

- `ngram` (prompt lookup): the longest recent n-gram of the request's own prompt + output that
  occurred before; what followed it then is the guess. Code repeats itself: brackets, identifiers,
  copied lines.
- `suffix` (after SuffixDecoding, arXiv 2411.04975): the same lookup over everything the session has
  seen, earlier prompts and outputs included, each continuation scored by how often it followed:
  what a developer's earlier completions and an agent's earlier turns repeat. Bounded per session,
  sessions evicted LRU.

How many guesses a step verifies is one decision (choose_drafts): each request's recent acceptance
against what extra decode rows cost on this machine now (StepTimes, measured from the engine's own
decode steps), so a step that is compute-bound (many rows, or a busy machine) guesses little or
nothing. A request whose guesses keep failing stops proposing for a while.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from warmpath.stats import MovingAverage


@dataclass
class Speculation:
    """A request's speculative state: its n-gram index over its own tokens, and its recent
    acceptance."""

    # n-gram -> where it last ended (exclusive)
    index: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed: int = 0  # tokens of the request the index covers
    acceptance: float = 1.0  # running mean of accepted / proposed
    pause: int = 0  # steps left without proposing (acceptance fell too low)
    proposed: int = 0
    accepted: int = 0

    def record(self, proposed: int, accepted: int) -> None:
        if not proposed:
            return
        self.proposed += proposed
        self.accepted += accepted
        self.acceptance = 0.7 * self.acceptance + 0.3 * accepted / proposed
        if self.acceptance < POOR_ACCEPTANCE:
            self.pause, self.acceptance = PAUSE_STEPS, RETRY_ACCEPTANCE

    def wants(self) -> bool:
        """Whether to guess at all this step (not while paused after poor acceptance)."""
        if self.pause:
            self.pause -= 1
            return False
        return True


class StepTimes:
    """Seconds of a decode-only step by its number of rows, a running mean of the engine's own
    steps: what one more verified row costs here, now (another process taking a core shows up in
    it). A row count not seen yet is assumed to cost what the nearest smaller one seen does, so it
    gets tried and measured."""

    def __init__(self, max_rows: int = 128):
        self._seconds = [MovingAverage() for _ in range(max_rows + 1)]

    def record(self, rows: int, seconds: float) -> None:
        if 0 < rows < len(self._seconds):
            self._seconds[rows].add(seconds)

    def at(self, rows: int) -> float | None:
        for n in range(min(rows, len(self._seconds) - 1), 0, -1):
            if self._seconds[n].value is not None:
                return self._seconds[n].value
        return None


def choose_drafts(decodes: int, acceptance: list[float], offered: list[int], times: StepTimes,
                  guess_seconds: float = 0.0) -> list[int]:
    """How many of each request's offered guesses to verify: rows are added one at a time, each to
    the request whose next guess is likeliest kept (acceptance ** position), while the step's
    expected tokens per second rise. decodes: the step's decoding requests (each computes one row
    anyway). guess_seconds: what making the guesses of one more position costs (a draft model's
    batched forward; free for a lookup), counted too."""
    taken = [0] * len(offered)
    tokens, rows = float(decodes), decodes
    base = times.at(rows)
    if base is None:
        return taken
    rate = tokens / base
    while True:
        best, gain = -1, 0.0
        for i, (a, k) in enumerate(zip(acceptance, offered, strict=True)):
            if taken[i] < k and a ** (taken[i] + 1) > gain:
                best, gain = i, a ** (taken[i] + 1)
        if best < 0:
            return taken
        t = times.at(rows + 1)
        if t is None:
            return taken
        # positions guessed: one batched guess each
        t += guess_seconds * max(*taken, taken[best] + 1)
        if (tokens + gain) / t <= rate:
            return taken
        taken[best] += 1
        tokens, rows, rate = tokens + gain, rows + 1, (tokens + gain) / t


POOR_ACCEPTANCE = 0.15  # below this running acceptance a request stops proposing ...
PAUSE_STEPS = 16  # ... for this many of its steps, then tries again at ...
RETRY_ACCEPTANCE = 0.4


def _extend_index(index: dict[tuple[int, ...], int], tokens: list[int], start: int, end: int,
                  n_min: int, n_max: int) -> None:
    """Index the n-grams (n_min..n_max) that end at positions start..end-1 (exclusive ends
    start+1..end)."""
    for e in range(max(start, 1), end + 1):
        for n in range(n_min, min(n_max, e) + 1):
            index[tuple(tokens[e - n : e])] = e


class NgramProposer:
    """Prompt lookup over the request's own prompt and output."""

    def __init__(self, n_min: int = 2, n_max: int = 4):
        self.n_min, self.n_max = n_min, n_max

    def propose(self, tokens: list[int], spec: Speculation, k: int) -> list[int]:
        # Index every n-gram that ends before the last token; the n-grams ending at the last token
        # are the query (indexing them first would find the query itself).
        _extend_index(spec.index, tokens, spec.indexed, len(tokens) - 1, self.n_min, self.n_max)
        spec.indexed = len(tokens) - 1
        for n in range(min(self.n_max, len(tokens)), self.n_min - 1, -1):
            end = spec.index.get(tuple(tokens[-n:]))
            if end is not None:
                return tokens[end : end + k]
        return []


SEPARATOR = -1  # between two requests in a session's history: no match runs across it


@dataclass
class SessionHistory:
    """What one session has seen: its earlier requests' tokens, one after another, and where each
    n_min-gram of them ended."""

    tokens: list[int] = field(default_factory=list)
    ends: dict[tuple[int, ...], list[int]] = field(default_factory=dict)


class SuffixProposer:
    """Lookup over the session's history plus the request's own tokens: the earlier places whose
    context matches the request's last tokens longest, and among them, token by token, the
    continuation that followed most often. Memory: at most max_tokens tokens of history over all
    sessions (the least recently used session's is dropped first)."""

    def __init__(self, n_min: int = 3, n_max: int = 8, max_tokens: int = 1 << 18,
                 max_candidates: int = 64):
        self.n_min, self.n_max = n_min, n_max
        self.max_tokens, self.max_candidates = max_tokens, max_candidates
        self.sessions: OrderedDict[str, SessionHistory] = OrderedDict()
        self.num_tokens = 0
        self.own = NgramProposer(2, n_max)

    def propose(self, tokens: list[int], spec: Speculation, k: int,
                session: str | None) -> list[int]:
        own = self.own.propose(tokens, spec, k)
        history = self.sessions.get(session) if session is not None else None
        if history is None or len(tokens) < self.n_min or len(own) == k:
            return own
        self.sessions.move_to_end(session)
        h = history.tokens
        found = history.ends.get(tuple(tokens[-self.n_min :]), [])[-self.max_candidates :]

        def matched(e: int) -> int:  # how far back the context agrees, up to n_max
            n = self.n_min
            while n < self.n_max and n < len(tokens) and e - n - 1 >= 0 and h[e - n -
                                                                              1] == tokens[-n - 1]:
                n += 1
            return n

        lengths = [matched(e) for e in found]
        longest = max(lengths, default=0)
        cands = [e for e, n in zip(found, lengths, strict=True) if n == longest]
        out: list[int] = []
        while cands and len(out) < k:
            votes = Counter(h[e] for e in cands if e < len(h) and h[e] != SEPARATOR)
            if not votes:
                break
            token = votes.most_common(1)[0][0]
            out.append(token)
            cands = [e + 1 for e in cands if e < len(h) and h[e] == token]
        return own if len(own) > len(out) else out

    def learn(self, session: str | None, tokens: list[int]) -> None:
        """A finished request's prompt + output joins its session's history."""
        if session is None or len(tokens) <= self.n_min:
            return
        history = self.sessions.setdefault(session, SessionHistory())
        self.sessions.move_to_end(session)
        start = len(history.tokens)
        history.tokens += [*tokens, SEPARATOR]
        h = history.tokens
        for e in range(start + self.n_min, len(h) - 1):  # n-grams ending inside the new tokens
            history.ends.setdefault(tuple(h[e - self.n_min : e]), []).append(e)
        self.num_tokens += len(tokens) + 1
        while self.num_tokens > self.max_tokens and self.sessions:
            self.num_tokens -= len(self.sessions.popitem(last=False)[1].tokens)

    def forget(self, session: str) -> None:
        history = self.sessions.pop(session, None)
        if history is not None:
            self.num_tokens -= len(history.tokens)
