"""A FIM prompt's short context: what a cold file's first requests are answered from while the whole
file computes (engine/scheduler/_short_context.py decides when). The text nearest the cursor: the
prefix's last lines and the suffix's first, no other files, as many tokens as this machine computes
in --short-context-ms (150: half an editor's ~300 ms first-token budget, the rest for the queue and
the first token), MIN_SHORT_CONTEXT_TOKENS at least. Its quality cost on real files:
docs/editors.md, "A cold file's first answers"."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from warmpath.api.fim import Fill, keep_suffix

MIN_SHORT_CONTEXT_TOKENS = 128
SUFFIX_SHARE = 4  # the suffix's first lines take at most a quarter of the tokens


def short_context_tokens(seconds_per_token: float, block_size: int, ms: float) -> int:
    """The tokens of a short context on a machine that computes a prompt token in
    `seconds_per_token` (the start-up figure: the same request gets the same short prompt)."""
    return max(MIN_SHORT_CONTEXT_TOKENS,
               int(ms / 1000 / seconds_per_token) // block_size * block_size)


def keep_prefix(prefix: str, budget: int, count: Callable[[str], int]) -> str:
    """The prefix's last lines, whole, while their tokens (`count`, line by line) fit `budget`; the
    last line (the cursor's, or the one above it) always. A function of the text alone."""
    lines = prefix.splitlines(keepends=True)
    kept, used = lines[-1:], count(lines[-1]) if lines else 0
    for line in reversed(lines[:-1]):
        used += count(line)
        if used > budget:
            break
        kept.insert(0, line)
    return "".join(kept)


def short_fill(fill: Fill, tokens: int, count: Callable[[str], int]) -> Fill:
    """`fill` cut to its short context of about `tokens` tokens: the suffix's first lines (a quarter
    at most), the prefix's last lines in what is left after them and the cursor's line, no other
    files."""
    suffix = None if fill.suffix is None else keep_suffix(fill.suffix, tokens // SUFFIX_SHARE,
                                                          count)
    left = tokens - (count(suffix) if suffix else 0) - (count(fill.middle) if fill.middle else 0)
    return replace(fill, prefix=keep_prefix(fill.prefix, left, count), suffix=suffix, extra=[])
