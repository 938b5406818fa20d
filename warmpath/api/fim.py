"""The FIM prompt, built in one place: a model's family (from its vocabulary or its name: one rule),
the family's layout, stops and repository context, the anchored layout, the suffix a prompt keeps, a
prompt written in another family's markers, and `render()`, which makes a Fill (the text around the
hole) the prompt text. Pure text, typed against a small Vocabulary: the server, the router (for an
engine that rejects `suffix`), the simulator and the evaluation all render here."""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

# The anchored layout (prefix-first families): the prompt's prefix ends at a line start a few lines
# above the cursor, and the lines from there to the cursor open the middle, after the middle marker
# (FIM training splits documents anywhere, so a middle that starts with text is the model's own
# format). Typing then changes nothing before the marker: context, prefix, suffix and marker stay in
# the prefix cache and each keystroke computes only the text it added. Which line start: the
# minimizer of a hash of the last ANCHOR_WINDOW complete lines, so the choice depends on the text
# alone (a request's prompt never depends on the server's state) and moves about once every
# (ANCHOR_WINDOW + 1) / 2 lines as the cursor goes down, each move recomputing the suffix once.
ANCHOR_WINDOW = 24
# cursor: the plain layout, the prefix up to the cursor before the suffix
LAYOUTS = ("anchored", "cursor")
# The suffix a FIM prompt keeps (keep_suffix()): its first lines, as many tokens as this machine
# computes in SUFFIX_MS, and MIN_SUFFIX_TOKENS at least. Every move of the anchor, and every file
# opened, computes the suffix again before the first token, inside an editor's ~300 ms deadline;
# fewer than MIN_SUFFIX_TOKENS cost more than 2 points of pass@1
# (benchmarks/results/fim_suffix_quality_qwen05_epyc_avx2.json).
SUFFIX_MS = 250.0
MIN_SUFFIX_TOKENS = 64


class Vocabulary(Protocol):
    """What the FIM prompt needs of a tokenizer (models/tokenizer.Tokenizer is one)."""

    @property
    def special_tokens(self) -> Mapping[str, int]: ...

    def token_to_id(self, text: str) -> int | None: ...


def _has(vocab: Vocabulary, token: str) -> bool:
    return token in vocab.special_tokens or vocab.token_to_id(token) is not None


@dataclass(frozen=True)
class FimTemplate:
    name: str
    tokens: tuple[str, ...]  # special tokens whose presence identifies the family
    layout: str  # "{context}" / "{prefix}" / "{suffix}" placeholders around the special tokens
    # Special tokens that end a completion of this family (a marker the model emits means it left
    # the hole: another file, another hole, padding). They are stop token ids and, spelled out in
    # text, stop strings.
    stops: tuple[str, ...] = ()
    repo_header: str | None = None  # how the family names the repository ("{repo}" placeholder)
    # the family's file separator token; None: other files go in as plain text
    file_sep: str | None = None

    @property
    def prefix_first(self) -> bool:
        """Prefix, suffix, then the middle marker (PSM): the text after the marker is the start of
        the middle."""
        return self.layout.index("{prefix}") < self.layout.index(
            "{suffix}") and self.layout.endswith(self.tokens[-1])

    def build(self, prefix: str, suffix: str, context: str = "", layout: str = "cursor") -> str:
        """The prompt: `context` (repo_context()) where the family reads it, always ahead of the
        prefix. layout "anchored" (prefix-first families): the prefix's last lines after the middle
        marker (anchor())."""
        if layout not in LAYOUTS:
            raise ValueError(f"FIM layout must be one of {LAYOUTS}, got {layout!r}")
        head = ""
        if layout == "anchored" and self.prefix_first:
            cut = anchor(prefix)
            prefix, head = prefix[:cut], prefix[cut:]
        text = self.layout.replace("{context}",
                                   context).replace("{prefix}", prefix).replace("{suffix}", suffix)
        return text + head

    def split(self, prompt: str) -> tuple[str, str] | None:
        """(the text before the cursor, the text after it) of a prompt written in this family's
        layout with its markers (Zed's edit prediction writes the prompt itself): the prefix with,
        for a prefix-first family, the middle's start after the marker; and the suffix. Repository
        context stays in the prefix. None when the prompt does not hold the layout's markers in
        order."""
        layout = self.layout.replace("{context}", "")
        parts: dict[str, str] = {}
        at = 0
        for name in sorted(("prefix", "suffix"), key=lambda n: layout.index("{" + n + "}")):
            i = layout.index("{" + name + "}")
            before = layout[:i].split("}")[-1]
            after = layout[i + len(name) + 2:].split("{")[0]
            start = prompt.find(before, at)
            if start < 0:
                return None
            start += len(before)
            end = prompt.find(after, start) if after else len(prompt)
            if end < 0:
                return None
            parts[name], at = prompt[start:end], end
        head = (prompt[at + len(self.tokens[-1]):]
                if self.prefix_first and prompt.startswith(self.tokens[-1], at) else "")
        return parts["prefix"] + head, parts["suffix"]


def anchor(prefix: str, window: int = ANCHOR_WINDOW) -> int:
    """Where the anchored layout cuts the prefix: just after one of its last `window` complete
    lines, the one of the lowest CRC-32 of its text with its newline (the latest of equals), 0 when
    it has no complete line. As lines are added below, the choice stays until that line leaves the
    window or a lower one is completed, and it never moves up."""
    best, best_hash, end = 0, None, len(prefix)
    for _ in range(window):
        nl = prefix.rfind("\n", 0, end)
        if nl < 0:
            break
        start = prefix.rfind("\n", 0, nl) + 1
        # with its newline: blank lines do not all hash to 0
        h = zlib.crc32(prefix[start:nl + 1].encode())
        if best_hash is None or h < best_hash:
            # going up: a strictly lower one wins, so equals keep the latest
            best, best_hash = nl + 1, h
        end = start
        if start == 0:
            break
    return best


def suffix_budget(seconds_per_token: float, block_size: int = 16, ms: float = SUFFIX_MS) -> int:
    """The suffix tokens a prompt keeps on a machine that computes a prompt token in
    `seconds_per_token`: what it computes in `ms`, whole KV blocks of it, MIN_SUFFIX_TOKENS at
    least."""
    return max(MIN_SUFFIX_TOKENS, int(ms / 1000 / seconds_per_token) // block_size * block_size)


def suffix_tokens(setting: str, seconds_per_token: float, block_size: int = 16) -> int | None:
    """--fim-suffix-tokens read: "auto" suffix_budget() of the measured speed, "all" None (no cut),
    or a count."""
    if setting == "auto":
        return suffix_budget(seconds_per_token, block_size)
    if setting == "all":
        return None
    if not setting.isdigit():
        raise ValueError(
            f"--fim-suffix-tokens must be auto, all or a number of tokens, got {setting!r}")
    return int(setting)


def keep_suffix(suffix: str, budget: int, count: Callable[[str], int]) -> str:
    """The suffix's first lines, whole, while their tokens (`count`, line by line) fit `budget`; the
    first line (the rest of the cursor's line) always. A function of the text alone: typing before
    the suffix never moves the cut, so the kept suffix stays in the prefix cache."""
    lines = suffix.splitlines(keepends=True)
    kept, used = lines[:1], count(lines[0]) if lines else 0
    for line in lines[1:]:
        used += count(line)
        if used > budget:
            break
        kept.append(line)
    return "".join(kept)


FIM_TEMPLATES = (
    FimTemplate("qwen2.5-coder", ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
                "{context}<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>",
                ("<|endoftext|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
                 "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|im_start|>", "<|im_end|>"),
                "<|repo_name|>{repo}\n", "<|file_sep|>"),
    FimTemplate("starcoder", ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
                "{context}<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>",
                ("<|endoftext|>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>",
                 "<file_sep>", "<repo_name>", "<filename>"), "<repo_name>{repo}",
                "<file_sep>"),  # StarCoder2 (StarCoder 1 has no <file_sep>)
    # DeepSeek-Coder reads other files as plain text at the start of the hole's file (its README's
    # form).
    FimTemplate("deepseek-coder", ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
                "<｜fim▁begin｜>{context}{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>",
                ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", "<｜end▁of▁sentence｜>",
                 "<|EOT|>")),
    FimTemplate(
        "codestral",
        ("[SUFFIX]", "[PREFIX]"),
        "{context}[SUFFIX]{suffix}[PREFIX]{prefix}",  # suffix first
        ("[PREFIX]", "[SUFFIX]", "[MIDDLE]", "</s>")),
)


@dataclass(frozen=True)
class ContextFile:
    """A file of repository-level context: a path and its text (llama.vim's `input_extra` chunk)."""

    filename: str
    text: str


def repo_context(extra: Sequence[ContextFile | Mapping[str, str]], template: FimTemplate | None,
                 repo: str = "", current_file: str = "") -> str:
    """Other files of the repository as the family's FIM prompt reads them, for
    FimTemplate.build(context=).

    Sorted by filename (then text), duplicates dropped: the same set of files gives the same bytes
    however the client orders it, so the context, which comes before the prefix, stays in the prefix
    cache from keystroke to keystroke. With a file separator it ends in one
    (`<|file_sep|>{current}\n` then the FIM marker): its tokens never depend on the prefix after it.
    Special-token strings in the files are read as special, as in the prompt. Qwen2.5-Coder:
    `<|repo_name|>{repo}\n<|file_sep|>{path}\n{text}` per file, then `<|file_sep|>{current}\n` (the
    hole's own file); StarCoder2:
    `<repo_name>{repo}<file_sep>{path}\n{text}...<file_sep>{current}\n`; families without a file
    separator: `{path}\n{text}` blocks. No repo name: no repository header. No files: "" (the plain
    FIM prompt)."""
    files = sorted(
        {
            f if isinstance(f, ContextFile) else ContextFile(
                f.get("filename") or "",
                f.get("text") or "")
            for f in extra
        }, key=lambda f: (f.filename, f.text))
    files = [f for f in files if f.text or f.filename]
    if not files:
        return ""
    body = [f"{f.filename}\n{_ends_line(f.text)}" for f in files]
    if template is None or template.file_sep is None:
        return "".join(body)
    sep = template.file_sep
    head = template.repo_header.replace("{repo}", repo) if template.repo_header and repo else ""
    return head + "".join(sep + b for b in body) + f"{sep}{current_file}\n"


def _ends_line(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


# Model-name fragments (lower case, as hubs name them) of each family: a node that serves
# "Qwen/Qwen2.5-Coder-7B" fills holes the qwen2.5-coder way. Checked in order; the first fragment
# found wins.
FAMILY_NAMES = (("qwen2.5-coder", "qwen2.5-coder"), ("qwen-coder", "qwen2.5-coder"),
                ("qwen3-coder", "qwen2.5-coder"), ("starcoder", "starcoder"),
                ("deepseek-coder", "deepseek-coder"), ("codestral", "codestral"))


def detect_fim(vocab: Vocabulary | None = None, model: str = "") -> FimTemplate | None:
    """The FIM family of a model; None: it has none (its prompts are the prefix alone). The
    vocabulary decides when there is one (the server's: the family whose markers it has, the
    repo-level markers it lacks dropped, so other files go in as text); without one (the router, the
    simulator, the evaluation) the model's name stands for it (FAMILY_NAMES)."""
    if vocab is None:
        name = model.lower()
        family = next((f for fragment, f in FAMILY_NAMES if fragment in name), None)
        return next((t for t in FIM_TEMPLATES if t.name == family), None)
    for t in FIM_TEMPLATES:
        if all(_has(vocab, tok) for tok in t.tokens):
            if t.file_sep and not _has(vocab, t.file_sep):
                return replace(t, file_sep=None, repo_header=None)
            if t.repo_header and not _has(vocab, t.repo_header.split("{repo}")[0]):
                return replace(t, repo_header=None)
            return t
    return None


def fim_stop_ids(vocab: Vocabulary, template: FimTemplate) -> list[int]:
    """The ids of the family's stop tokens this vocabulary has (each a single token)."""
    ids = (vocab.token_to_id(t) for t in template.stops)
    return sorted({i for i in ids if i is not None})


def split_literal(prompt: str, vocab: Vocabulary) -> tuple[str, str, str] | None:
    """(prefix, suffix, family) when the prompt is exactly one family's FIM layout written out as
    text (Continue with `provider: openai` renders
    `<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>` itself for a model name it does not know)
    and this vocabulary does not have that family's tokens: the hole is then filled this model's way
    instead of the markers being completed as text. None otherwise."""
    for t in FIM_TEMPLATES:
        if not all(tok in prompt for tok in t.tokens):
            continue
        if all(_has(vocab, tok) for tok in t.tokens):
            return None  # the model's own markers: they are tokenized as its special tokens
        pattern = re.escape(t.layout.replace("{context}",
                                             "")).replace(r"\{prefix\}", "(?P<prefix>.*)")
        pattern = pattern.replace(r"\{suffix\}", "(?P<suffix>.*)")
        m = re.fullmatch(pattern, prompt, re.DOTALL)
        if m and not any(tok in m["prefix"] or tok in m["suffix"] for tok in t.tokens):
            return m["prefix"], m["suffix"], t.name
    return None


# -- a Fill as prompt text -------------------------------------------------------------------------
@dataclass(frozen=True)
class Fill:
    """The text around the hole: the model writes what goes between `prefix + middle` and `suffix`.

    `middle` is the cursor's line so far (llama.cpp's `prompt`): rendered last, after the FIM middle
    marker, so everything before it stays in the prefix cache while the developer types along one
    line.
    """

    prefix: str
    suffix: str | None = None  # None: a plain completion of the prefix
    middle: str = ""
    # in the client's order (stable keystroke to keystroke)
    extra: Sequence[ContextFile] = field(default_factory=list)
    # the repository's name (Tabby's git_url): the context's repo header, where the family has one
    repo: str = ""
    # the file being edited (Tabby's filepath): the context's last file separator names it
    filename: str = ""

    def routing_text(self) -> str:
        """What the router's prefix policy hashes: the parts in the order they are rendered
        (context, sorted as repo_context sorts it, then prefix, line), so requests that share a
        rendered prefix share a routing prefix."""
        context = "".join(sorted({f"{e.filename}\x1f{e.text}\x1e" for e in self.extra}))
        where = f"{self.repo}\x1f{self.filename}\x1d" if self.extra and (self.repo or
                                                                         self.filename) else ""
        return where + context + self.prefix + self.middle


@dataclass(frozen=True)
class Rendered:
    """A Fill as prompt text, and what the answer's end depends on."""

    text: str
    # the family's name; "prefix-only" (no FIM tokens); None: a plain completion
    fim_mode: str | None
    stops: tuple[str, ...] = ()  # the family's markers: the answer ends at one
    # the text before and after the cursor: the completion scope's
    cursor: tuple[str, str] | None = None


def render(fill: Fill, template: FimTemplate | None, layout: str = "anchored") -> Rendered:
    """The prompt: repository context, then the family's FIM layout (or the prefix alone for a model
    without FIM tokens: the scope cuts where the suffix begins), then the cursor's line (last, so
    what comes before it stays cached while the developer types along the line). A prompt with no
    suffix that is written in the family's own layout (Zed writes it itself) is sent as it is, and
    answered as a FIM prompt."""
    context = repo_context(fill.extra, template, fill.repo, fill.filename)
    if fill.suffix is None:
        text = context + fill.prefix + fill.middle
        own = template.split(text) if template is not None else None
        return Rendered(text, None) if own is None else Rendered(text, template.name,
                                                                 template.stops, own)
    cursor = (fill.prefix + fill.middle, fill.suffix)
    if template is None:
        return Rendered(context + fill.prefix + fill.middle, "prefix-only", (), cursor)
    return Rendered(
        template.build(fill.prefix, fill.suffix, context, layout) + fill.middle, template.name,
        template.stops, cursor)


@dataclass(frozen=True)
class FimFormat:
    """How one model's prompts are rendered: its family (None: the prefix alone), the layout, the
    suffix kept (`suffix_tokens`, its first lines as `count` counts tokens; None: all of it) and the
    vocabulary a prompt written in another family's markers is read against (None: not read)."""

    template: FimTemplate | None
    layout: str = "anchored"
    suffix_tokens: int | None = None
    count: Callable[[str], int] | None = None
    vocab: Vocabulary | None = None

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(
                f"--fim-layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")

    def hole_at_end(self, fill: Fill) -> Fill:
        """Other files without a suffix (OpenAI's `extra` alone): still a FIM prompt, the context
        where the family reads it and the hole at the end. Decided once per request, before any
        context is cut to fit."""
        if fill.suffix is None and self.template is not None and any(e.text or e.filename
                                                                     for e in fill.extra):
            return replace(fill, suffix="")
        return fill

    def render(self, fill: Fill) -> Rendered:
        """render() in this model's format: a prompt written in another family's markers, which this
        vocabulary has no tokens for, is read as the prefix and suffix it holds; the suffix's first
        lines only, while the answer's scope reads all of it."""
        if fill.suffix is None and self.vocab is not None and (split := split_literal(
                fill.prefix, self.vocab)):
            prefix, suffix, family = split
            r = self.render(replace(fill, prefix=prefix, suffix=suffix))  # a suffix now: read once
            return replace(
                r,
                fim_mode=f"{r.fim_mode}; the prompt's {family} markers read as prefix and suffix")
        if (self.suffix_tokens is None or not fill.suffix or self.template is None
                or self.count is None):
            return render(fill, self.template, self.layout)
        r = render(replace(fill, suffix=keep_suffix(fill.suffix, self.suffix_tokens, self.count)),
                   self.template, self.layout)
        return replace(r, cursor=(r.cursor[0], fill.suffix)) if r.cursor else r
