"""How each editor asks for a completion and inserts the answer, for the real-repository set.

The developer's buffer is the file with the hole cut out, the cursor where the hole starts. Each
client sends what that editor sends (its window of the file, its protocol's body) and turns the
answer into what the editor puts in the buffer (its own trimming and discard rules, then an
insertion at the cursor). What it inserts is then judged against the real file (eval/repo.py). Every
request is greedy, so a run is repeatable; that is the one change made to the editors' bodies
(llama.vim samples at temperature 1 after top-k / top-p, Continue at 0.01), and none of their time
limits is sent (they make an answer depend on the machine's speed; latency is reported beside).

- llama.vim (`autoload/llama.vim` at a1c8e6e): `/infill`, 256 lines before the cursor's line and 64
  after, the cursor's line split at the cursor (`prompt`, the start of `input_suffix`); a line of
  only whitespace is sent empty, and the answer's own indentation replaces it; `n_indent`,
  `n_predict: 128`; the answer's empty last lines dropped, and it is discarded when it repeats the
  rest of the line or the next lines (`s:fim_render`); Tab inserts it whole, the rest of the line
  after it.
- zed: the `open_ai_compatible_api` edit prediction provider (`crates/edit_prediction/src/fim.rs`):
  whole lines around the cursor, about 512 tokens counted as bytes / 3, down then up; the Qwen FIM
  prompt written out, four stop strings, no temperature, not streamed; the answer cut at the first
  FIM marker and inserted whole.
- continue: the OpenAI provider's autocomplete (`core/autocomplete`): 307 tokens of prefix and at
  most 205 of suffix (whole lines; 4 characters a token here), Qwen's repository form with other
  files, its 12 stop strings, streamed; its line filters (the first blank line, a line equal or
  nearly equal to the line below the cursor, a line repeated, the suffix written again) and a
  multi-line answer replacing the rest of the cursor's line.
- openai: `/v1/completions` with `prompt` and `suffix` (minuet-ai.nvim's `openai_fim_compatible`,
  12,000 characters before the cursor and 4,000 after); inserted whole.
- lsp: `warmpath lsp` over stdio, a real LSP client asking `textDocument/inlineCompletion`
  (eval/lsp_client.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from warmpath.api.fim import FIM_TEMPLATES
from warmpath.eval.holes import Hole

QWEN = next(t for t in FIM_TEMPLATES if t.name == "qwen2.5-coder")
ZED_STOPS = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"]
ZED_CUT = ("<|endoftext|>", "<|file_separator|>", "<|fim_pad|>", "<|fim_prefix|>", "<|fim_middle|>",
           "<|fim_suffix|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<PRE>", "<SUF>",
           "<MID>", "[PREFIX]", "[SUFFIX]")
CONTINUE_STOPS = [
    "<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<|im_start|>", "<|im_end|>", "/src/", "#- coding: utf-8",
    "```"
]


@dataclass(frozen=True)
class Buffer:
    """The developer's buffer: the file without the hole, the cursor at its start."""

    hole: Hole

    @property
    def before(self) -> str:
        return self.hole.prefix

    @property
    def after(self) -> str:
        return self.hole.suffix

    @property
    def line_before(self) -> str:  # the cursor's line up to the cursor
        return self.before[self.before.rfind("\n") + 1:]

    @property
    def line_after(self) -> str:  # the cursor's line from the cursor
        return self.after.split("\n", 1)[0]

    def lines_above(self, n: int) -> list[str]:
        lines = self.before.split("\n")[:-1]
        return lines[max(0, len(lines) - n):]

    def lines_below(self, n: int) -> list[str]:
        lines = self.after.split("\n")[1:]
        if lines and lines[-1] == "":
            lines = lines[:-1]
        return lines[:n]


@dataclass(frozen=True)
class Insertion:
    """What the editor puts in the buffer: `text` at the cursor, or from the start of the cursor's
    line when `from_line_start` (llama.vim on a line of only whitespace); `replaces` characters
    after the cursor on its line are replaced (Continue's multi-line answer replaces the rest of the
    line)."""

    text: str
    from_line_start: bool = False
    replaces: int = 0

    def apply(self, hole: Hole) -> str:
        """The file after the insertion."""
        b = Buffer(hole)
        start = len(b.before) - len(b.line_before) if self.from_line_start else len(b.before)
        return b.before[:start] + self.text + b.after[self.replaces:]


# -- llama.vim -------------------------------------------------------------------------------------
def llama_vim_body(hole: Hole, model: str | None, extra: list[dict]) -> dict:
    b = Buffer(hole)
    line = b.line_before + b.line_after
    blank = not line.strip()
    prompt, rest = ("", "") if blank else (b.line_before, b.line_after)
    indent = 0 if blank else len(line) - len(line.lstrip(" \t"))
    return {
        "id_slot": 0,
        "input_prefix": "".join(x + "\n" for x in b.lines_above(256)),
        "input_suffix": rest + "\n" + "".join(x + "\n" for x in b.lines_below(64)),
        "input_extra": extra,
        "prompt": prompt,
        "n_predict": 128,
        "stop": [],
        "n_indent": indent,
        "top_k": 40,
        "top_p": 0.90,
        "samplers": ["top_k", "top_p", "infill", "temperature"],
        "temperature": 0.0,
        "stream": False,
        "cache_prompt": True,
        # llama.vim's fields, and warmpath's finish_reason and confidence (a server without them
        # leaves them out)
        "response_fields": [
            "content", "timings/prompt_n", "timings/predicted_n", "tokens_cached", "truncated",
            "finish_reason", "confidence"
        ],
        **({"model": model} if model else {})
    }


def llama_vim_insert(hole: Hole, content: str) -> Insertion:
    """s:fim_render and Tab (llama#fim_accept): what the buffer gets, empty when the suggestion is
    discarded."""
    b = Buffer(hole)
    lines = content.split("\n")
    while lines and lines[-1] == "":
        lines.pop()
    if not lines:
        return Insertion("")
    blank = not (b.line_before + b.line_after).strip()
    line_before, line_after = ("", "") if blank else (b.line_before, b.line_after)
    below = b.lines_below(len(lines) + 64)
    if len(lines) == 1 and lines[0] == "":
        return Insertion("")
    if len(lines) > 1 and lines[0] == "" and lines[1:] == below[:len(lines) - 1]:
        return Insertion("")
    if len(lines) == 1 and lines[0] == line_after:
        return Insertion("")
    nonblank = next((i for i, x in enumerate(below) if x.strip()), None)
    if nonblank is not None and line_before + lines[0] == below[nonblank]:
        nxt = below[nonblank + 1:]
        if len(lines) == 1 or (len(lines) == 2 and nxt and lines[1] == nxt[0][:len(lines[1])]) or \
                (len(lines) > 2 and lines[1:] == nxt[:len(lines) - 1]):
            return Insertion("")
    if not "".join(lines).strip():
        return Insertion("")
    return Insertion("\n".join(lines), from_line_start=blank)


# -- Zed -------------------------------------------------------------------------------------------
ZED_BYTES = 512 * 3  # fim.rs: 512 tokens of context, a token counted as 3 bytes


def zed_window(hole: Hole) -> tuple[str, str]:
    """Whole lines around the cursor's, one below then one above, while they fit ZED_BYTES."""
    b = Buffer(hole)
    above, below = b.before.split("\n")[:-1], b.after.split("\n")[1:]
    used = len((b.line_before + b.line_after).encode())
    up = down = 0
    grew = True
    while grew:
        grew = False
        for side in ("down", "up"):
            lines, taken = (below, down) if side == "down" else (above, up)
            if taken < len(lines):
                cost = max(1, len(lines[-1 - taken if side == "up" else taken].encode()) + 1)
                if used + cost <= ZED_BYTES:
                    used += cost
                    grew = True
                    if side == "down":
                        down += 1
                    else:
                        up += 1
    prefix = "".join(x + "\n" for x in above[len(above) - up:]) + b.line_before
    suffix = b.line_after + "".join("\n" + x
                                    for x in below[:down]) + ("\n" if down < len(below) else "")
    return prefix, suffix


def zed_body(hole: Hole, model: str | None, extra: list[dict]) -> dict:
    """Zed sends no other files."""
    prefix, suffix = zed_window(hole)
    return {"model": model, "prompt": f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>",
            "max_tokens": 128, "stop": ZED_STOPS}


def zed_insert(hole: Hole, text: str) -> Insertion:
    for marker in ZED_CUT:
        if marker in text:
            text = text[:text.find(marker)]
    return Insertion(text)


# -- Continue --------------------------------------------------------------------------------------
# Continue counts with its own tokenizer (tiktoken's or Llama's), ~4 characters of code a token
CHARS_PER_TOKEN = 4


def continue_window(hole: Hole) -> tuple[str, str]:
    b = Buffer(hole)
    budget = int(1024 * 0.3) * CHARS_PER_TOKEN
    lines = b.before.split("\n")
    while len(lines) > 1 and len("\n".join(lines)) > budget:
        lines = lines[1:]
    prefix = "\n".join(lines)
    left = min(1024 * CHARS_PER_TOKEN - len(prefix), int(1024 * 0.2) * CHARS_PER_TOKEN)
    lines = b.after.split("\n")
    while len(lines) > 1 and len("\n".join(lines)) > left:
        lines = lines[:-1]
    return prefix, "\n".join(lines) or "\n"


def continue_body(hole: Hole, model: str | None, extra: list[dict]) -> dict:
    prefix, suffix = continue_window(hole)
    head = ""
    if extra:
        head = "<|repo_name|>" + hole.project.rsplit("/", 1)[-1] + "\n" + "".join(
            f"<|file_sep|>{e['filename']}\n{e['text']}\n"
            for e in extra) + f"<|file_sep|>{hole.path}\n"
    return {
        "model": model,
        "prompt": f"{head}<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>",
        "max_tokens": 4096, "temperature": 0.0, "stream": True, "stop": CONTINUE_STOPS
    }


def _near(a: str, b: str) -> bool:
    a, b = a.strip(), b.strip()
    if a == b:
        return True
    if len(a) <= 4 or len(b) <= 4:
        return False
    return levenshtein(a, b) / len(b) < 0.1


def continue_insert(hole: Hole, text: str) -> Insertion:
    """Continue's stream filters (core/autocomplete/filtering), its postprocessing, and its
    insertion."""
    b = Buffer(hole)
    for stop in (*CONTINUE_STOPS, "diff --git"):
        if stop in text:
            text = text[:text.find(stop)]
    suffix = b.after
    if len(suffix) >= 20:  # stopAtStartOf: the model writing the suffix's start again
        target = suffix.lstrip()[:30]
        for i in range(20, len(text) + 1):
            if text[i - 20:i] in target:
                text = text[:i - 20]
                break
    below = next((x for x in b.lines_below(64) if x.strip()), "")
    out: list[str] = []
    repeats = 0
    single = b.line_before.lstrip().startswith(("#", "//"))
    for i, line in enumerate(text.split("\n")):
        if single and i > 0:
            break
        if "```" in line:
            break
        if i > 0 and below and line == below:  # stopAtLinesExact
            break
        if out and line == out[-1]:  # stopAtRepeatingLines: dropped, the third copy ends it
            repeats += 1
            if repeats >= 2:
                break
            continue
        repeats = 0
        if i > 0 and not line.strip():  # noDoubleNewLine
            break
        if below and _near(line, below) and (i > 0 or not b.line_before.strip()):
            # stopAtSimilarLine
            break
        out.append(line)
    text = "\n".join(out)
    if not text.strip():
        return Insertion("")
    last = next((x for x in reversed(b.before.split("\n")) if x.strip()), "")
    first = next((x for x in out if x.strip()), "")
    if last and _near(first, last):
        return Insertion("")
    if b.before.endswith(" ") and text.startswith(" "):
        text = text[1:]
    if "\n" in text:  # a multi-line answer replaces the rest of the cursor's line
        return Insertion(text, replaces=len(b.line_after))
    if len(b.line_after.strip()) >= 2 and text.endswith(b.line_after):
        # the rest of the line written again
        return Insertion(text, replaces=len(b.line_after))
    return Insertion(text)


# -- OpenAI completions with suffix ----------------------------------------------------------------
def openai_body(hole: Hole, model: str | None, extra: list[dict]) -> dict:
    body = {
        "model": model, "prompt": hole.prefix[-12000:], "suffix": hole.suffix[:4000],
        "max_tokens": 128, "temperature": 0.0
    }
    if extra:
        body["extra"] = extra
    return body


def levenshtein(a: str, b: str) -> int:
    if len(a) < len(b):
        a, b = b, a
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


@dataclass(frozen=True)
class Client:
    """An editor: where it sends a hole (a path at the server's root; None: not over HTTP), its
    body, whether it streams, and what it puts in the buffer for the answer's text."""

    name: str
    path: str | None
    body: Callable[[Hole, str | None, list[dict]], dict] | None
    insert: Callable[[Hole, str], Insertion]


def as_is(hole: Hole, text: str) -> Insertion:
    return Insertion(text)


CLIENTS = {c.name: c for c in (
    Client("llama.vim", "/infill", llama_vim_body, llama_vim_insert),
    Client("zed", "/v1/completions", zed_body, zed_insert),
    Client("continue", "/v1/completions", continue_body, continue_insert),
    Client("openai", "/v1/completions", openai_body, as_is),
    Client("lsp", None, None, as_is),  # eval/lsp_client.py: the item's text, inserted at the cursor
)}
