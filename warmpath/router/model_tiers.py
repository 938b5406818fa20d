"""Model tiering: which tier (small fast model or large model) a request goes to.

The rule (documented in docs/router.md): a request is a *line* completion, sent to the first
(smallest) tier, when
- it carries `X-Completion-Kind: line`, or
- it is a `/v1/completions` request with `max_tokens` <= `line_max_tokens` and either no suffix or a
  suffix whose first line (the rest of the cursor's line) is empty or only closing brackets, quotes
  and punctuation, i.e. the developer is at the end of a line and wants that line finished.
Everything else (multi-line completions, chat, explain, agent turns, `X-Completion-Kind:
block|chat`) goes to the last (largest) tier.
"""

from __future__ import annotations

import re

LINE, MULTI = "line", "multi"
_CLOSING = re.compile(r"""[\s)\]}>;,:'"`]*""")


def completion_kind(path: str, body: dict, header: str | None, line_max_tokens: int) -> str:
    if header:
        return LINE if header.strip().lower() == LINE else MULTI
    if not path.endswith("/completions") or path.endswith("/chat/completions"):
        return MULTI
    max_tokens = body.get("max_tokens", 16)  # the server's default for /v1/completions
    if not isinstance(max_tokens, int) or max_tokens > line_max_tokens:
        return MULTI
    suffix = body.get("suffix")
    if not suffix or not isinstance(suffix, str):
        return LINE
    rest_of_line = suffix.split("\n", 1)[0]
    return LINE if _CLOSING.fullmatch(rest_of_line) else MULTI
